"""plan_micro_batches and plan_data_parallel: the decision on plain lengths, and the agreement.

This module composes the pure partitioner (``seqbal.partition``) with the data-parallel
agreement (``collectives.py``). It needs only NumPy: torch (through ``collectives``) is
imported only in sync mode, when the caller already holds a process group, so planning on a
driver, in the CLI or in a trainer that is not built on torch costs no torch import.
:func:`seqbal.rearrange.rearrange_micro_batches` adds reading the lengths from a TensorDict
and copying each micro-batch out of it.

Errors are detected locally first and raised as :class:`MicroBatchPlanError` (a
``ValueError``). In sync mode a rank that found one does *not* raise at once: it joins the
first all-reduce with an error code, so that every rank learns of the failure and raises
together; raising first would leave the healthy ranks blocked in a collective until the
process-group timeout.

With ``dummy_micro_batches=True`` in sync mode, a rank with fewer groups than the agreed count
is not an error: it proposes the count it needs like any rank, partitions its groups one per
part, and returns empty index lists for the rest (the caller fills them with copies of a
sample, see :func:`dummy_source`). The flag is one of the arguments every rank must match: a
rank that raised ``Cannot satisfy`` while its peers went on to the second all-reduce would hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from .partition import exact as _small_exact, windows as _windows
from .cost import CostModel, as_cost_model, padded_min_count, padded_partitions
from .partition import capped_balanced_partitions, packing_lower_bound, roundup_divisible, smallest_feasible_partitions
from .partition.parts import _part_sums
from .validation import INT64_MAX, LengthsError, balance_workloads, check_int64_sums, int_argument, int_array

__all__ = [
    "MicroBatchPlanError",
    "LengthsLike",
    "plan_micro_batches",
    "plan_data_parallel",
    "order_for_pipeline",
    "dummy_source",
]

#: Effective lengths: a sequence of ints, a NumPy integer array or a 1-D integer torch tensor.
LengthsLike = Union[Sequence[int], np.ndarray, Any]


class MicroBatchPlanError(ValueError):
    """A micro-batch plan cannot be made; the message says which input and what numbers.

    ``code`` orders the kinds of failure for the data-parallel agreement (the largest code
    found on any rank is the one every rank reports).
    """

    CANNOT_SATISFY = 1
    FORCED_GROUP_EXCEEDS = 2
    SAMPLE_EXCEEDS = 3
    NEGATIVE_LENGTH = 4
    EMPTY_BATCH = 5
    BAD_BATCH = 6
    BAD_ARGUMENT = 7
    #: Found only by the agreement (never sent by one rank): the ranks passed different values
    #: of an argument that must be identical on every rank of ``dp_group``.
    MISMATCHED_ARGUMENTS = 8

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[Any, tuple[str, int]]:
        # BaseException pickles ``self.args`` (the message alone) and would call
        # ``cls(message)`` on load, which lacks ``code``: pickle and deepcopy (Ray and
        # ProcessPoolExecutor workers) need both arguments back.
        return (type(self), (str(self), self.code))


_REASONS = {
    MicroBatchPlanError.CANNOT_SATISFY: "it cannot form the number of micro-batches needed",
    MicroBatchPlanError.FORCED_GROUP_EXCEEDS: "a forced group exceeds max_token_len",
    MicroBatchPlanError.SAMPLE_EXCEEDS: "a sample exceeds max_token_len",
    MicroBatchPlanError.NEGATIVE_LENGTH: "a sequence length is negative",
    MicroBatchPlanError.EMPTY_BATCH: "its batch is empty",
    MicroBatchPlanError.BAD_BATCH: "its batch is malformed",
    MicroBatchPlanError.BAD_ARGUMENT: "an argument is invalid",
    MicroBatchPlanError.MISMATCHED_ARGUMENTS: "the ranks passed different arguments",
}

#: Arguments that must be identical on every rank of ``dp_group``: a different cap or group size
#: would silently plan each rank under its own rules, a different divisor gives different counts
#: (a hang in the training step). ``min_num_micro_batch`` may differ: the agreed count is the
#: largest proposal, so it honours the largest minimum on every rank.
_MUST_MATCH = (
    "max_token_len",
    "num_batches_divided_by",
    "force_group_size",
    "cost_model.padded",
    "cost_model.round_to",
    "cost_model.pack_round_to",
    "dummy_micro_batches",
)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Arguments:
    """The validated integer arguments of a call, as Python ints."""

    max_token_len: int
    num_batches_divided_by: Optional[int]
    min_num_micro_batch: Optional[int]
    force_group_size: int
    cost_model: CostModel = CostModel()
    dummy_micro_batches: bool = False

    def must_match(self) -> tuple[int, ...]:
        """Values of ``_MUST_MATCH`` (a missing divisor is 1, which means the same)."""
        cost = self.cost_model
        return (
            self.max_token_len,
            self.num_batches_divided_by or 1,
            self.force_group_size,
            int(cost.padded),
            cost.round_to,
            cost.pack_round_to,
            int(self.dummy_micro_batches),
        )


def _validate_arguments(
    max_token_len: Any,
    num_batches_divided_by: Any,
    min_num_micro_batch: Any,
    force_group_size: Any,
    cost_model: Any = None,
    dummy_micro_batches: Any = False,
) -> _Arguments:
    """Check the integer arguments and return them as Python ints, and the cost model.

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


# ---------------------------------------------------------------------------------------------
# The local decision
# ---------------------------------------------------------------------------------------------


@dataclass
class _LocalPlan:
    """What one rank decides from its own lengths before any agreement.

    Under the token cost, ``group_tokens`` are the (rounded) tokens of each forced group and
    a part fits when their sum is ``<= capacity`` (the cap, lowered to a multiple of the packed
    rounding). Under the padded cost, a part fits when ``samples x its longest`` is
    ``<= capacity``; ``group_longest`` holds each group's longest (rounded) sample.
    """

    group_tokens: np.ndarray  # tokens per forced group, after per-sequence rounding
    group_workloads: np.ndarray  # workload per forced group (token cost only)
    group_longest: np.ndarray  # longest sample per forced group, after rounding
    group_size: int
    capacity: int  # what a part's cost is compared with
    cost_model: CostModel
    count: int  # smallest count (>= min, multiple of step) at which this rank meets the cap
    parts: list[list[int]]  # a cap-respecting partition of the groups into ``count`` parts
    # Padded cost of micro-batches trimmed to their window (trim_padding): each group's first
    # and last-plus-one columns (seqbal.partition.windows); ``group_longest`` then holds their widths.
    windows: Optional[tuple[np.ndarray, np.ndarray]] = None
    # Workload per sample under the token cost (what ``group_workloads`` sums), for the
    # pipeline order; None under the padded cost.
    sample_workloads: Optional[np.ndarray] = None

    @property
    def num_groups(self) -> int:
        return len(self.group_tokens)

    def partition_at(self, count: int) -> Optional[list[list[int]]]:
        """Cap-respecting partition of the groups into ``count`` parts; None if none was found."""
        if count == self.count:
            return self.parts
        if self.windows is not None:
            return self._windowed_partition(count, self.parts)
        if self.cost_model.padded:
            return padded_partitions(self.group_longest, self.group_size, self.capacity, count)
        return capped_balanced_partitions(
            self.group_tokens, self.group_workloads, self.capacity, count, feasible=self.parts
        )

    def fits(self, part: Sequence[int]) -> bool:
        """Whether a non-empty part of groups costs at most the cap under the cost model."""
        if not len(part):
            return False
        if self.windows is not None:
            starts, stops = self.windows
            return _windows.window_cost(part, starts, stops, self.group_size, self.cost_model.round_to) <= self.capacity
        if self.cost_model.padded:
            return len(part) * self.group_size * int(self.group_longest[part].max()) <= self.capacity
        return int(self.group_tokens[part].sum()) <= self.capacity

    def _windowed_partition(self, count: int, known: Optional[list[list[int]]]) -> Optional[list[list[int]]]:
        """``count`` parts whose trimmed windows fit: the padded partition on the groups' own
        widths, over-cap parts cut (``seqbal.partition.windows``); where that gives more than ``count``
        parts, ``known`` (a feasible partition with fewer) split up to ``count``."""
        starts, stops = self.windows
        g, round_to = self.group_size, self.cost_model.round_to
        candidate = padded_partitions(self.group_longest, g, self.capacity, count)
        if candidate is not None:
            candidate = _windows.fit_to_cap(candidate, starts, stops, g, round_to, self.capacity)
        if (candidate is None or len(candidate) > count) and known is not None:
            candidate = known
        if candidate is None:
            return None
        return _windows.split_to_count(candidate, starts, stops, g, round_to, count)

    def samples_of(self, group_parts: list[list[int]]) -> list[list[int]]:
        g = self.group_size
        if g == 1:
            return [sorted(part) for part in group_parts]
        return [sorted(chain.from_iterable(range(i * g, i * g + g) for i in part)) for part in group_parts]


def _cost_note(cost_model: CostModel, measured: int, tokens: int) -> str:
    """What a sample's length becomes under a cost model other than effective tokens: nothing
    for the default, `` under the <model>``, or `` (M after rounding, under the <model>)``."""
    if cost_model.is_default:
        return ""
    if measured == tokens:
        return f" under the {cost_model}"
    return f" ({measured} after rounding, under the {cost_model})"


def _local_plan(
    lengths: np.ndarray,
    max_token_len: int,
    num_batches_divided_by: Optional[int],
    min_num_micro_batch: Optional[int],
    force_group_size: int,
    cost_model: CostModel = CostModel(),
    windows: Optional[tuple[np.ndarray, np.ndarray]] = None,
    short_ok: bool = False,
) -> _LocalPlan:
    """This rank's smallest feasible count and a partition at it.

    With ``short_ok`` (synced dummy micro-batches) a count above the number of groups is not
    an error: the plan keeps it as this rank's proposal and one group per part as its
    partition; the agreement then fills the missing parts with dummies.
    """
    n = len(lengths)
    if n % force_group_size:
        raise MicroBatchPlanError(
            f"force_group_size={force_group_size} does not divide the batch size {n}", MicroBatchPlanError.BAD_BATCH
        )
    g = force_group_size
    windows = windows if cost_model.padded else None  # only a padded forward pays for the window
    if windows is not None:
        # Trimmed, a sample costs the width of its window (first to last token), not its count.
        starts, stops = (np.asarray(w, dtype=np.int64) for w in windows)
        measured = cost_model.rounded(np.maximum(stops - starts, 0))
    else:
        measured = cost_model.rounded(lengths)
    sample_capacity = cost_model.sample_capacity(max_token_len)
    over = np.flatnonzero(measured > sample_capacity)
    if over.size:
        index = int(over[0])
        note = (
            f" spread over a window of {int(np.maximum(stops - starts, 0)[index])} columns (trim_padding keeps its "
            f"first to last token), costing {int(measured[index])} under the {cost_model}"
            if windows is not None
            else _cost_note(cost_model, int(measured[index]), int(lengths[index]))
        )
        raise MicroBatchPlanError(
            f"sample {index} has {int(lengths[index])} tokens{note}, which exceeds "
            f"max_token_len={max_token_len} ({over.size} sample(s) over the cap; the largest has "
            f"{int(lengths.max())} tokens)",
            MicroBatchPlanError.SAMPLE_EXCEEDS,
        )
    try:  # before any sum: token totals must not wrap around in int64 (workloads cannot, see below)
        check_int64_sums(measured)
    except ValueError as error:
        raise MicroBatchPlanError(str(error), MicroBatchPlanError.BAD_BATCH) from None
    group_tokens = measured.reshape(-1, g).sum(axis=1)
    group_longest = measured.reshape(-1, g).max(axis=1)
    group_costs = cost_model.group_costs(lengths, g)
    if windows is not None:
        windows = (starts.reshape(-1, g).min(axis=1), stops.reshape(-1, g).max(axis=1))
        group_longest = cost_model.rounded(np.maximum(windows[1] - windows[0], 0))
        group_costs = g * group_longest
    over = np.flatnonzero(group_costs > max_token_len)
    if over.size:
        index = int(over[0])
        cost = "" if cost_model.is_default else f", costing {int(group_costs[index])} under the {cost_model}"
        raise MicroBatchPlanError(
            f"forced group exceeds max_token_len: group {index} (samples {index * g}..{index * g + g - 1}, "
            f"force_group_size={g}) has {int(lengths.reshape(-1, g)[index].sum())} tokens{cost} > "
            f"max_token_len={max_token_len}",
            MicroBatchPlanError.FORCED_GROUP_EXCEEDS,
        )
    step = num_batches_divided_by or 1
    min_count = min_num_micro_batch or 1
    sample_workloads = None  # set under the token cost, below
    # A cap below the packed rounding leaves room only for empty samples (checked above), which
    # fit any positive capacity: the partitioner needs one.
    sample_capacity = max(sample_capacity, 1)
    if windows is not None:
        group_workloads = np.zeros(0, dtype=np.int64)
        plan = _LocalPlan(group_tokens, group_workloads, group_longest, g, max_token_len, cost_model, 0, [], windows)
        # The least count on the groups' own widths, then what cutting the over-cap parts needs.
        least = max(min_count, padded_min_count(group_longest, g, max_token_len))
        parts = padded_partitions(group_longest, g, max_token_len, least) if least <= len(group_longest) else None
        if parts is None:
            count = roundup_divisible(least, step)
        else:
            parts = _windows.fit_to_cap(parts, *windows, g, cost_model.round_to, max_token_len)
            count = roundup_divisible(max(min_count, len(parts)), step)
            parts = plan._windowed_partition(count, parts) if count <= len(group_longest) else None
    elif cost_model.padded:
        group_workloads = np.zeros(0, dtype=np.int64)  # the padded partitioner weighs runs itself
        count = roundup_divisible(max(min_count, padded_min_count(group_longest, g, max_token_len)), step)
        parts = padded_partitions(group_longest, g, max_token_len, count) if count <= len(group_longest) else None
    else:
        sample_workloads = balance_workloads(measured)  # exact where int64 fits
        group_workloads = sample_workloads.reshape(-1, g).sum(axis=1)
        count, parts = smallest_feasible_partitions(
            group_tokens, group_workloads, sample_capacity, min_count=min_count, step=step
        )
        if step > 1 and parts is not None:
            count, parts = _one_multiple_lower(group_tokens, group_workloads, sample_capacity, count, parts, min_count, step)
    if parts is None and short_ok:
        parts = [[group] for group in range(len(group_tokens))]
    if parts is None:
        model = "" if cost_model.is_default else f" under the {cost_model}"
        raise MicroBatchPlanError(
            f"Cannot satisfy max_token_len={max_token_len}{model}: {int(lengths.sum())} tokens in "
            f"{len(group_tokens)} group(s) of {g} sample(s) need at least {count} micro-batches "
            f"(min_num_micro_batch={min_num_micro_batch}, num_batches_divided_by={num_batches_divided_by}), "
            f"but only {len(group_tokens)} non-empty micro-batches can be formed; raise max_token_len, "
            f"lower min_num_micro_batch or num_batches_divided_by, or give this rank more samples",
            MicroBatchPlanError.CANNOT_SATISFY,
        )
    return _LocalPlan(
        group_tokens, group_workloads, group_longest, g, sample_capacity, cost_model, count, parts, windows,
        sample_workloads,
    )


def _one_multiple_lower(
    tokens: np.ndarray,
    workloads: np.ndarray,
    capacity: int,
    count: int,
    parts: list[list[int]],
    min_count: int,
    step: int,
) -> tuple[int, list[list[int]]]:
    """``(count, parts)``, or one multiple of ``step`` lower where a few groups fit in it.

    Rounding to a multiple of ``num_batches_divided_by`` turns a count the search's tries miss
    into a whole multiple more. On a few groups (``seqbal.partition.exact.MAX_ITEMS``), when the
    multiple below is not below the packing bound, a budgeted exact search looks for it, and the
    partition it finds is balanced by :func:`capped_balanced_partitions`. Costs nothing with
    ``step == 1``, on larger batches, or at the bound.
    """
    lower = count - step
    if len(tokens) > _small_exact.MAX_ITEMS or lower < max(min_count, packing_lower_bound(tokens, capacity)):
        return count, parts
    found = _small_exact.exact_fit(tokens, capacity, lower)
    if found is None:
        return count, parts
    balanced = capped_balanced_partitions(tokens, workloads, capacity, lower, feasible=found)
    return lower, balanced if balanced is not None else found


def _rank_name(group: Any, rank_in_group: int) -> str:
    """``rank r of the data-parallel group``, plus its global rank when that differs (subgroups)."""
    name = f"rank {rank_in_group} of the data-parallel group"
    if group is None:
        return name
    from . import collectives

    world_rank = collectives.global_rank(group, rank_in_group)
    return name if world_rank == rank_in_group else f"{name} (global rank {world_rank})"


def _cannot_satisfy_agreed(
    max_token_len: int, count: int, min_groups: int, min_groups_rank: int, group: Any
) -> MicroBatchPlanError:
    return MicroBatchPlanError(
        f"Cannot satisfy max_token_len={max_token_len} on every data-parallel rank: the ranks need {count} "
        f"micro-batches each, but {_rank_name(group, min_groups_rank)} has only {min_groups} "
        f"forced group(s) to fill them; raise max_token_len or balance the samples across ranks",
        MicroBatchPlanError.CANNOT_SATISFY,
    )


def _peer_failure(agreement: Any, max_token_len: Any, group: Any) -> MicroBatchPlanError:
    reason = _REASONS.get(agreement.error_code, f"error code {agreement.error_code}")
    prefix = "Cannot satisfy max_token_len: " if agreement.error_code == MicroBatchPlanError.CANNOT_SATISFY else ""
    return MicroBatchPlanError(
        f"{prefix}{_rank_name(group, agreement.error_rank)} failed: {reason} "
        f"(max_token_len={max_token_len!r} here); this rank's own data was valid, see rank "
        f"{agreement.error_rank}'s error for the numbers",
        agreement.error_code,
    )


def dummy_source(lengths: LengthsLike, force_group_size: int = 1, cost_model: Union[None, str, CostModel] = None) -> list[int]:
    """The samples a dummy micro-batch copies: the rank's cheapest forced group.

    With ``force_group_size=1`` that is the shortest sample (the first on ties): one sample,
    which costs at most the cap under every cost model because every sample was checked
    against it. With ``force_group_size=g > 1`` the planner's unit is a group, so a dummy is
    a copy of the group that costs least under ``cost_model`` (``g`` samples): it keeps the
    shape a group-wise loss expects (``g`` rows of one group), and it costs at most the cap
    because every group was checked against it. Ties: fewer raw tokens, then the first group.
    O(n log n).

    Raises:
        MicroBatchPlanError: no samples (there is nothing to copy).

    Examples:
        >>> dummy_source([5, 2, 7, 2])
        [1]
        >>> dummy_source([5, 2, 7, 1], force_group_size=2)  # groups cost 7 and 8 tokens
        [0, 1]
    """
    array = _lengths_array(lengths)
    try:
        g = int_argument("force_group_size", force_group_size, expected="an int >= 1")
    except ValueError as error:
        raise MicroBatchPlanError(str(error), MicroBatchPlanError.BAD_ARGUMENT) from None
    if len(array) % g:
        raise MicroBatchPlanError(
            f"force_group_size={force_group_size} does not divide the batch size {len(array)}", MicroBatchPlanError.BAD_BATCH
        )
    costs = as_cost_model(cost_model).group_costs(array, g)
    # least cost, then fewest raw tokens (rounding makes costs tie), then the first group
    cheapest = int(np.lexsort((np.arange(len(costs)), array.reshape(-1, g).sum(axis=1), costs))[0])
    return list(range(cheapest * g, cheapest * g + g))


def order_for_pipeline(parts: list[list[int]], workloads: np.ndarray) -> list[list[int]]:
    """Order micro-batches heaviest in the middle, lightest at both ends.

    Sorts by (workload, first index) descending, then takes ``parts[::2][::-1] + parts[1::2]``:
    light micro-batches at the ends shorten pipeline warm-up and cool-down bubbles. O(k log k).
    """
    values = np.asarray(workloads)
    values = values.astype(np.int64) if values.dtype.kind in "iu" else values  # sums as .sum() would form them
    return _pipeline_order(parts, _part_sums(values, parts).tolist())  # one NumPy pass


def _pipeline_order(parts: list[list[int]], totals: Sequence[int]) -> list[list[int]]:
    """:func:`order_for_pipeline` given each micro-batch's total workload."""
    ranked = sorted(range(len(parts)), key=lambda i: (totals[i], parts[i][0] if parts[i] else 0), reverse=True)
    ordered = [parts[i] for i in ranked]
    return ordered[::2][::-1] + ordered[1::2]


@dataclass(frozen=True)
class _WindowedLengths:
    """Effective lengths of a batch whose micro-batches will be trimmed to their padding window
    (``rearrange_micro_batches(..., trim_padding=True)``), with each sample's first column and
    last column + 1 (``(width, 0)`` for a sample without tokens): under the padded cost a
    trimmed micro-batch costs ``samples x`` the union of its samples' windows."""

    lengths: Any
    starts: np.ndarray
    stops: np.ndarray


@dataclass
class _LocalStage:
    """One rank's outcome before any agreement: a plan, or the error it must report."""

    plan: Optional[_LocalPlan]
    lengths: Optional[np.ndarray]
    problem: Optional[Exception]
    code: int  # MicroBatchPlanError code of ``problem``, 0 without one
    arguments: Optional[_Arguments] = None  # None when the arguments themselves are invalid


def _local_stage(
    get_lengths: Callable[[], LengthsLike],
    max_token_len: Any,
    num_batches_divided_by: Any,
    min_num_micro_batch: Any,
    force_group_size: Any,
    cost_model: Any = None,
    dummy_micro_batches: Any = False,
    *,
    capture_unexpected: bool,
    synced: bool = False,
) -> _LocalStage:
    """Validate and plan on this rank's own data, capturing the error instead of raising it.

    With ``capture_unexpected`` (sync mode) any exception is captured, not only ours: an
    unexpected one must still reach the agreement, or the peers would hang. With ``synced``
    and ``dummy_micro_batches``, a count above this rank's groups is left to the dummies.
    """
    arguments = None
    try:
        arguments = _validate_arguments(
            max_token_len, num_batches_divided_by, min_num_micro_batch, force_group_size, cost_model,
            dummy_micro_batches,
        )
        measured = get_lengths()
        windows = None
        if isinstance(measured, _WindowedLengths):
            measured, windows = measured.lengths, (measured.starts, measured.stops)
        try:
            lengths = _lengths_array(measured)
        except MicroBatchPlanError as error:
            if error.code != MicroBatchPlanError.EMPTY_BATCH or not arguments.dummy_micro_batches:
                raise
            raise MicroBatchPlanError(
                f"{error}; dummy_micro_batches=True cannot help: a dummy is a copy of one of the rank's own "
                f"samples, and this rank has none (give every rank at least one sample)",
                error.code,
            ) from None
        plan = _local_plan(
            lengths,
            arguments.max_token_len,
            arguments.num_batches_divided_by,
            arguments.min_num_micro_batch,
            arguments.force_group_size,
            arguments.cost_model,
            windows,
            short_ok=synced and arguments.dummy_micro_batches,
        )
        return _LocalStage(plan, lengths, None, 0, arguments)
    except MicroBatchPlanError as error:
        return _LocalStage(None, None, error, error.code, arguments)
    except Exception as error:  # noqa: BLE001
        if not capture_unexpected:
            raise
        wrapped = MicroBatchPlanError(
            f"the batch could not be read: {type(error).__name__}: {error}", MicroBatchPlanError.BAD_BATCH
        )
        wrapped.__cause__ = error
        return _LocalStage(None, None, wrapped, wrapped.code, arguments)


def _mismatch_error(ranges: Sequence[Optional[tuple[int, int]]]) -> Optional[MicroBatchPlanError]:
    """The error every rank raises when the agreed (min, max) of a must-match argument differ.

    Built from agreed values only, so that every rank raises the very same message.
    """
    differing = [
        f"{name} from {low} to {high}" + (" (None counts as 1)" if name == "num_batches_divided_by" else "")
        for name, bounds in zip(_MUST_MATCH, ranges)
        if bounds is not None
        for low, high in [bounds]
        if low != high
    ]
    if not differing:
        return None
    return MicroBatchPlanError(
        f"the ranks of the data-parallel group passed different arguments that must be identical on every "
        f"rank: {'; '.join(differing)}. Pass the same {', '.join(_MUST_MATCH)} on every rank of dp_group "
        f"(min_num_micro_batch may differ: the largest one applies to every rank)",
        MicroBatchPlanError.MISMATCHED_ARGUMENTS,
    )


def _check_dp_group(dp_group: Any) -> None:
    """``dp_group`` must be None or a torch.distributed ProcessGroup; raised before any collective.

    A string or a rank number here is a caller's slip that would otherwise fail deep inside
    torch.distributed (``AttributeError ... 'size'``) or be ignored without a process group.
    """
    if dp_group is None:
        return
    from . import collectives  # a caller passing a group already has torch loaded

    if not collectives.is_process_group(dp_group):
        raise MicroBatchPlanError(
            f"dp_group must be None or a torch.distributed ProcessGroup (e.g. torch.distributed.group.WORLD "
            f"or one made with torch.distributed.new_group), got {type(dp_group).__name__} {dp_group!r}",
            MicroBatchPlanError.BAD_ARGUMENT,
        )


def _try_partition(local: _LocalPlan, count: int) -> tuple[Optional[list[list[int]]], bool, Optional[Exception]]:
    """Partition at ``count``: (partition, within the cap with exactly ``count`` non-empty parts, error)."""
    try:
        if count == local.num_groups < local.count:  # a short rank (dummies): one group per part,
            # each group was checked against the cap
            candidate = [[group] for group in range(count)]
        else:
            candidate = local.partition_at(count)
    except Exception as error:  # noqa: BLE001 - a bug here must not leave the peers blocked
        return None, False, error
    within_limit = candidate is not None and len(candidate) == count and all(map(local.fits, candidate))
    return candidate, within_limit, None


def _finish(stage: _LocalStage, group_parts: list[list[int]], use_dynamic_bsz_balance: bool) -> list[list[int]]:
    """Sample index lists of a group partition, ordered for the pipeline if asked."""
    assert stage.plan is not None and stage.lengths is not None
    parts = stage.plan.samples_of(group_parts)
    if not use_dynamic_bsz_balance:
        return parts
    cost = stage.plan.cost_model
    if not cost.padded:  # the workloads the plan balanced
        return order_for_pipeline(parts, stage.plan.sample_workloads)
    # A padded micro-batch computes on samples x its longest.
    measured = cost.rounded(stage.lengths)
    longest = [int(measured[p].max()) for p in parts]
    return _pipeline_order(parts, [len(p) * int(w) for p, w in zip(parts, balance_workloads(np.array(longest)))])


def _sync_mode(dp_group: Any, same_micro_num_in_dp: bool) -> bool:
    from . import collectives  # torch is loaded only here, where the caller already holds a group

    return collectives.is_sync_mode(dp_group, same_micro_num_in_dp)


def _plan(
    get_lengths: Callable[[], LengthsLike],
    max_token_len: int,
    dp_group: Any,
    num_batches_divided_by: Optional[int],
    same_micro_num_in_dp: bool,
    min_num_micro_batch: Optional[int],
    use_dynamic_bsz_balance: bool,
    force_group_size: int,
    cost_model: Union[None, str, CostModel] = None,
    dummy_micro_batches: bool = False,
) -> list[list[int]]:
    _check_dp_group(dp_group)
    flag_problem = None
    try:
        use_dynamic_bsz_balance = _as_flag("use_dynamic_bsz_balance", use_dynamic_bsz_balance)
        # An unreadable sync flag is taken as "sync" where a group is given: its peers most likely
        # passed the same flag and wait in the agreement, which this rank then joins with the error.
        same_micro_num_in_dp = _as_flag("same_micro_num_in_dp", same_micro_num_in_dp)
    except MicroBatchPlanError as error:
        flag_problem, same_micro_num_in_dp = error, True
    sync = dp_group is not None and _sync_mode(dp_group, same_micro_num_in_dp)
    stage = _local_stage(
        get_lengths, max_token_len, num_batches_divided_by, min_num_micro_batch, force_group_size, cost_model,
        dummy_micro_batches, capture_unexpected=sync, synced=sync,
    )
    if flag_problem is not None:
        stage = _LocalStage(None, None, flag_problem, flag_problem.code, stage.arguments)
    if not sync:
        if stage.problem is not None:
            raise stage.problem
        assert stage.plan is not None
        return _finish(stage, stage.plan.parts, use_dynamic_bsz_balance)

    from . import collectives

    local = stage.plan
    # Every rank reaches this all-reduce, failing or not: see the module docstring.
    agreement = collectives.agree_on_constraints(
        proposal=local.count if local else 0,
        max_group_tokens=int(local.group_tokens.max()) if local else 0,
        num_groups=local.num_groups if local else 0,
        error_code=stage.code,
        group=dp_group,
        must_match=stage.arguments.must_match() if stage.arguments else (None,) * len(_MUST_MATCH),
    )
    # A mismatch first: it is usually why some rank failed, and every rank can tell it alike.
    mismatch = _mismatch_error(agreement.must_match_ranges)
    if mismatch is not None:
        raise mismatch
    if agreement.error_code:
        if stage.problem is None:
            raise _peer_failure(agreement, max_token_len, dp_group)
        # Its own message, the agreed code: every rank of the group raises the same code.
        if isinstance(stage.problem, MicroBatchPlanError):
            stage.problem.code = agreement.error_code
        raise stage.problem
    assert local is not None and stage.arguments is not None
    max_token_len = stage.arguments.max_token_len
    step = stage.arguments.num_batches_divided_by or 1
    dummies = stage.arguments.dummy_micro_batches
    count = roundup_divisible(agreement.count, step)
    while True:
        if count > agreement.min_groups and not dummies:
            raise _cannot_satisfy_agreed(max_token_len, count, agreement.min_groups, agreement.min_groups_rank, dp_group)
        # With dummies a rank short of groups partitions what it has (one group per part) and
        # fills the rest of the agreed count with empty index lists: the dummy micro-batches.
        real = min(count, local.num_groups)
        candidate, within_limit, failure = _try_partition(local, real)
        check = collectives.check_within_limit(within_limit, failure is not None, dp_group)
        if failure is not None:
            raise failure
        if check.failed_rank >= 0:
            raise RuntimeError(
                f"{_rank_name(dp_group, check.failed_rank)} failed while partitioning at the "
                f"agreed count {count} (an internal error of seqbal, see that rank's traceback); this "
                f"rank's own partition was fine"
            )
        if check.within_limit:
            assert candidate is not None
            return _finish(stage, candidate, use_dynamic_bsz_balance) + [[] for _ in range(count - real)]
        count += step


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


def plan_micro_batches(
    seq_lens: LengthsLike,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    cost_model: Union[None, str, CostModel] = None,
    *,
    dummy_micro_batches: bool = False,
) -> list[list[int]]:
    """Decide the micro-batches of a batch from its effective lengths alone.

    Returns exactly the index lists :func:`rearrange_micro_batches` would return for a batch
    with these lengths, with the same guarantees, errors and collectives; use it for trainers
    whose batches are not TensorDicts, or to see a plan before launching.

    Args:
        seq_lens: effective (non-padding) length of each sample: a sequence of ints, a NumPy
            integer array, or a 1-D integer tensor (any device; copied to the CPU once).
        max_token_len: hard cap on the effective tokens of every micro-batch.
        dp_group: process group of the data-parallel ranks (sync mode, see below). Default None.
        num_batches_divided_by: the count must be a multiple of this (virtual pipeline stages).
            Default None (no constraint).
        same_micro_num_in_dp: with ``dp_group`` and an initialised process group, every rank of
            the group gets the same count. Default True.
        min_num_micro_batch: the count must be at least this (pipeline parallelism). Default None.
        use_dynamic_bsz_balance: order micro-batches heaviest in the middle (see
            :func:`order_for_pipeline`); False keeps the partitioner's order. Default True.
        force_group_size: samples ``i*g .. i*g+g-1`` always share a micro-batch. Default 1.
        cost_model: what a micro-batch costs against ``max_token_len``: ``None`` or
            ``"tokens"`` (default: its effective tokens, for remove-padding forwards),
            ``"padded"`` (``samples x longest``, for padded forwards), or a
            :class:`~seqbal.CostModel` with per-sequence or packed rounding. Must be the same
            on every rank of ``dp_group``.
        dummy_micro_batches: in sync mode, a rank with fewer forced groups than the agreed
            count (or than ``min_num_micro_batch``/``num_batches_divided_by`` ask) gets the
            agreed count anyway: one micro-batch per group, then empty index lists ``[]``
            at the end, one per missing micro-batch (see :func:`dummy_source` for what
            :func:`rearrange_micro_batches` puts in them). Outside sync mode it changes
            nothing: a rank's own count never exceeds its groups, and a minimum or divisor
            it cannot meet stays an error (no peer waits on this rank, so there is nothing
            to keep in step). Must be the same on every rank of ``dp_group``. Default False.

    Returns:
        One ascending list of sample indices per micro-batch; together they hold every index
        exactly once; no list is empty; every micro-batch costs at most ``max_token_len``
        (effective tokens by default, else under ``cost_model``);
        the count is at least ``ceildiv(total, max_token_len)`` and ``min_num_micro_batch``, a
        multiple of ``num_batches_divided_by``, and in sync mode equal on every rank.
        Deterministic. Cost: O(n log n) plus a few partitioning passes; in sync mode exactly two
        all-reduces. With ``dummy_micro_batches``, the lists after the real ones may be empty
        (dummies); every guarantee holds for the real ones, and the count (dummies included)
        is the agreed one.

    Integer arguments may be any integral type (``np.uint32(2)`` is 2); each must fit in int64,
    and ``bool`` is rejected.

    Raises:
        ValueError: (:class:`MicroBatchPlanError`) invalid arguments, an empty batch, a negative
            length, a sample or forced group over the cap, or a count that cannot be formed
            (``Cannot satisfy max_token_len ...``). In sync mode every rank raises together; if
            the ranks passed different ``max_token_len``, ``num_batches_divided_by``,
            ``force_group_size`` or ``cost_model``, every rank raises the same error saying so. A ``dp_group``
            that is not None or a ProcessGroup is an error before any collective.

    Examples:
        >>> plan_micro_batches([7] * 8, max_token_len=8)  # ceildiv(56, 8) = 7 is only a bound
        [[1], [3], [5], [7], [6], [4], [2], [0]]
        >>> plan_micro_batches([3, 5, 2, 6], max_token_len=8, use_dynamic_bsz_balance=False)
        [[2, 3], [0, 1]]
        >>> plan_micro_batches([6, 1, 1, 1, 5, 1], max_token_len=12, cost_model="padded")  # 2 x 6, 4 x 1
        [[0, 4], [1, 2, 3, 5]]
    """
    return _plan(
        lambda: seq_lens,
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
        cost_model,
        dummy_micro_batches,
    )


def plan_data_parallel(
    rank_seq_lens: Sequence[LengthsLike],
    max_token_len: int,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    cost_model: Union[None, str, CostModel] = None,
) -> list[list[list[int]]]:
    """What synced data-parallel ranks would decide, computed in one process, no collective.

    ``rank_seq_lens[r]`` is the effective lengths rank ``r`` would pass to
    :func:`plan_micro_batches` with a ``dp_group`` of ``len(rank_seq_lens)`` ranks. The same
    protocol runs with the all-reduces replaced by a max/min over the list, so the result is
    exactly what each rank would get: use it to check a length distribution, a cap and a
    data-parallel size before launching (the ``seqbal plan --dp N`` command does).

    Returns:
        Per rank, the micro-batches as ascending index lists into that rank's lengths; every
        rank has the same count, with every guarantee of :func:`plan_micro_batches`.

    Raises:
        ValueError: (:class:`MicroBatchPlanError`) the error the failing rank would raise (the
            one with the largest code, the highest rank on ties), its message prefixed with
            ``rank r:`` when there is more than one rank; or ``Cannot satisfy max_token_len``
            when the agreed count exceeds some rank's number of groups.

    Examples:
        >>> [len(parts) for parts in plan_data_parallel([[7] * 8, [1] * 8], 8)]
        [8, 8]
    """
    use_dynamic_bsz_balance = _as_flag("use_dynamic_bsz_balance", use_dynamic_bsz_balance)
    if len(rank_seq_lens) == 0:
        raise MicroBatchPlanError("rank_seq_lens is empty: give one length list per rank", MicroBatchPlanError.BAD_ARGUMENT)
    stages = [
        _local_stage(
            (lambda lengths=lengths: lengths), max_token_len, num_batches_divided_by, min_num_micro_batch,
            force_group_size, cost_model, capture_unexpected=False,
        )
        for lengths in rank_seq_lens
    ]
    world = len(stages)
    failing = [rank for rank, stage in enumerate(stages) if stage.problem is not None]
    if failing:
        # The same rank the packed MAX all-reduce would report: largest code, then highest rank.
        rank = max(failing, key=lambda r: (stages[r].code, r))
        problem = stages[rank].problem
        if world == 1:
            raise problem
        raise MicroBatchPlanError(f"rank {rank}: {problem}", stages[rank].code) from problem
    plans = [stage.plan for stage in stages]
    arguments = stages[0].arguments
    assert arguments is not None
    max_token_len, num_batches_divided_by = arguments.max_token_len, arguments.num_batches_divided_by
    min_groups_rank = max(range(world), key=lambda r: (-plans[r].num_groups, r))
    min_groups = plans[min_groups_rank].num_groups
    step = num_batches_divided_by or 1
    count = roundup_divisible(max(plan.count for plan in plans), step)
    while True:
        if count > min_groups:
            raise _cannot_satisfy_agreed(max_token_len, count, min_groups, min_groups_rank, None)
        attempts = [_try_partition(plan, count) for plan in plans]
        for candidate, _, failure in attempts:
            if failure is not None:
                raise failure
        if all(within for _, within, _ in attempts):
            return [_finish(stage, candidate, use_dynamic_bsz_balance) for stage, (candidate, _, _) in zip(stages, attempts)]
        count += step
