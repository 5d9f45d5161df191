"""The plan's arguments: read and checked before any planning, on every rank.

Errors are detected locally first and raised as :class:`~seqbal.plan.errors.MicroBatchPlanError`
(a ``ValueError``). Every check here runs before the first collective: in sync mode a rank that
found a problem joins the agreement with its error code instead of raising at once (see
:mod:`.agreement`), so a check made after it would be a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from ..cost import CostModel, as_cost_model
from ..order import MICRO_BATCH_ORDERS, check_micro_batch_order, order_code
from ..validation import INT64_MAX, LengthsError, int_argument, int_array
from ..workload import WorkloadFn, workload_digest
from .errors import LengthsLike, MicroBatchPlanError


@dataclass(frozen=True)
class _Arguments:
    """The validated integer arguments of a call, as Python ints."""

    max_token_len: int
    num_batches_divided_by: Optional[int]
    min_num_micro_batch: Optional[int]
    force_group_size: int
    cost_model: CostModel = CostModel()
    dummy_micro_batches: bool = False
    max_samples_per_micro_batch: Optional[int] = None
    workload_fn: Optional[WorkloadFn] = field(default=None, compare=False)
    # :func:`seqbal.workload.workload_digest` of ``workload_fn``: what the ranks compare, so
    # computed only where they do (:meth:`with_digest`, sync mode); 0 elsewhere
    workload_digest: int = 0
    micro_batch_order: str = "pipeline"

    def with_digest(self) -> "_Arguments":
        """These arguments with ``workload_digest`` computed (sync mode: the ranks compare it).

        Raises:
            MicroBatchPlanError: the model fails on :data:`seqbal.workload.WORKLOAD_PROBE`.
        """
        try:
            return replace(self, workload_digest=workload_digest(self.workload_fn))
        except ValueError as error:
            raise MicroBatchPlanError(
                f"workload_fn on the probe lengths: {error}", MicroBatchPlanError.BAD_ARGUMENT
            ) from None

    def must_match(self, ordered: bool = True) -> tuple[int, ...]:
        """Values of ``_MUST_MATCH`` (a missing divisor is 1, which means the same; a missing
        sample cap is 0, which no cap can be). ``ordered=False`` (``use_dynamic_bsz_balance=False``:
        micro-batches run in the partitioner's order) is an order of its own, so a rank that does
        not order is told apart from one that orders by the default."""
        cost = self.cost_model
        return (
            self.max_token_len,
            self.num_batches_divided_by or 1,
            self.force_group_size,
            int(cost.padded),
            cost.round_to,
            cost.pack_round_to,
            int(self.dummy_micro_batches),
            self.max_samples_per_micro_batch or 0,
            *(cost.memory.match_values() if cost.memory is not None else (0, 0, 0, 0)),
            self.workload_digest,
            order_code(self.micro_batch_order) if ordered else len(MICRO_BATCH_ORDERS),
        )


def _validate_arguments(
    max_token_len: Any,
    num_batches_divided_by: Any,
    min_num_micro_batch: Any,
    force_group_size: Any,
    cost_model: Any = None,
    dummy_micro_batches: Any = False,
    max_samples_per_micro_batch: Any = None,
    workload_fn: Any = None,
    micro_batch_order: Any = "pipeline",
) -> _Arguments:
    """Check the integer arguments and return them as Python ints, and the cost model.

    ``workload_fn`` must be None or a callable (its workloads are checked where they are computed,
    and on the probe lengths in sync mode: :meth:`_Arguments.with_digest`); ``micro_batch_order``
    must name an order of :mod:`seqbal.order`.

    Any integral type is accepted (``np.uint32(2)``, ``np.int16(4096)``) and converted, so that
    no later arithmetic wraps or mixes unsigned and signed NumPy scalars; ``bool`` is rejected.
    Every value must fit in int64 (:func:`seqbal.validation.int_argument`: every entry point
    checks its integers there, in 64 bits because they travel through the packed all-reduce).
    """

    def bad(message: str) -> MicroBatchPlanError:
        return MicroBatchPlanError(message, MicroBatchPlanError.BAD_ARGUMENT)

    def checked(name: str, value: Any, expected: str) -> int:
        try:
            return int_argument(name, value, expected=expected)
        except ValueError as error:
            raise bad(str(error)) from None

    def optional(name: str, value: Any) -> Optional[int]:
        return None if value is None else checked(name, value, "None or an int >= 1")

    try:
        cost = as_cost_model(cost_model)
    except ValueError as error:
        raise bad(str(error)) from None
    if workload_fn is not None and not callable(workload_fn):
        raise bad(f"workload_fn must be None or a callable (lengths -> workloads), got {workload_fn!r:.80}")
    try:
        micro_batch_order = check_micro_batch_order(micro_batch_order)
    except ValueError as error:
        raise bad(str(error)) from None
    if not isinstance(dummy_micro_batches, (bool, np.bool_)):
        raise bad(f"dummy_micro_batches must be True or False, got {dummy_micro_batches!r}")
    for field_name in ("round_to", "pack_round_to"):  # they travel in the packed int64 all-reduce too
        if getattr(cost, field_name) > INT64_MAX:
            raise bad(
                f"cost_model.{field_name}={getattr(cost, field_name)} is too large: seqbal counts tokens in int64, "
                f"at most 2**63 - 1"
            )
    return _Arguments(
        max_token_len=checked("max_token_len", max_token_len, "a positive int"),
        force_group_size=checked("force_group_size", force_group_size, "an int >= 1"),
        num_batches_divided_by=optional("num_batches_divided_by", num_batches_divided_by),
        min_num_micro_batch=optional("min_num_micro_batch", min_num_micro_batch),
        cost_model=cost,
        dummy_micro_batches=bool(dummy_micro_batches),
        max_samples_per_micro_batch=(
            None if max_samples_per_micro_batch is None
            else checked("max_samples_per_micro_batch", max_samples_per_micro_batch, "None or a positive int")
        ),
        workload_fn=workload_fn,
        micro_batch_order=micro_batch_order,
    )


#: What :class:`seqbal.validation.LengthsError` kinds become in the agreement's codes.
_LENGTHS_CODES = {
    "bad": MicroBatchPlanError.BAD_BATCH,
    "empty": MicroBatchPlanError.EMPTY_BATCH,
    "negative": MicroBatchPlanError.NEGATIVE_LENGTH,
}


def _as_flag(name: str, value: Any) -> bool:
    """A bool argument as a bool, or a :class:`MicroBatchPlanError` naming it: ``bool()`` of a
    tensor or array of several values raises RuntimeError or ValueError deep in a call (in sync
    mode after the agreement, on one rank alone)."""
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 - whatever bool() raises, the caller passed no flag
        shape = getattr(value, "shape", None)
        what = f"a {type(value).__name__} of shape {tuple(shape)}" if shape is not None else f"{value!r:.60}"
        raise MicroBatchPlanError(
            f"{name} must be True or False, got {what} (a tensor or array of one element at most)",
            MicroBatchPlanError.BAD_ARGUMENT,
        ) from None


def _lengths_array(seq_lens: LengthsLike) -> np.ndarray:
    """Effective lengths as a 1-D int64 NumPy array, validated (:func:`seqbal.validation.int_array`)."""
    try:
        return int_array(
            seq_lens, "seq_lens", samples=True, integral_floats=False, sums=False,
            empty="the batch is empty (0 samples): nothing to split",
        )
    except LengthsError as error:
        raise MicroBatchPlanError(str(error), _LENGTHS_CODES[error.kind]) from None
