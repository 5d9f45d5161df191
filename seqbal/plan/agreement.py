"""The data-parallel agreement: :func:`_plan`, the sync mode and the peers' errors.

This composes the local decision (:mod:`.local`) with the data-parallel agreement
(``collectives.py``). torch (through ``collectives``) is imported only in sync mode, when the
caller already holds a process group, so planning on a driver, in the CLI or in a trainer that
is not built on torch costs no torch import.

In sync mode a rank that found an error does *not* raise at once: it joins the first all-reduce
with an error code, so that every rank learns of the failure and raises together; raising first
would leave the healthy ranks blocked in a collective until the process-group timeout. The
``dummy_micro_batches`` flag is one of the arguments every rank must match: a rank that raised
``Cannot satisfy`` while its peers went on to the second all-reduce would hang.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ..cost import CostModel
from ..order import MICRO_BATCH_ORDERS
from ..partition import roundup_divisible
from .arguments import _as_flag
from .errors import LengthsLike, MicroBatchPlanError, _MUST_MATCH, _REASONS
from .local import _LocalStage, _finish, _local_stage, _try_partition


def _rank_name(group: Any, rank_in_group: int) -> str:
    """``rank r of the data-parallel group``, plus its global rank when that differs (subgroups)."""
    name = f"rank {rank_in_group} of the data-parallel group"
    if group is None:
        return name
    from .. import collectives

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


def _mismatch_error(ranges: Sequence[Optional[tuple[int, int]]]) -> Optional[MicroBatchPlanError]:
    """The error every rank raises when the agreed (min, max) of a must-match argument differ.

    Built from agreed values only, so that every rank raises the very same message.
    """
    def shown(name: str, value: int) -> str:  # memory coefficients travel as float64 bit patterns
        if name.startswith("cost_model.memory.per_"):
            return f"{float(np.int64(value).view(np.float64)):.6g}"
        if name == "micro_batch_order":
            if value == len(MICRO_BATCH_ORDERS):
                return "none (use_dynamic_bsz_balance=False)"
            return repr(MICRO_BATCH_ORDERS[value]) if 0 <= value < len(MICRO_BATCH_ORDERS) else str(value)
        return str(value)

    notes = {
        "num_batches_divided_by": " (None counts as 1)",
        "workload_fn": " (digests of its workloads on fixed probe lengths: the ranks balance on different models)",
    }

    differing = [
        f"{name} from {shown(name, low)} to {shown(name, high)}"
        + notes.get(name, "")
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
    from .. import collectives  # a caller passing a group already has torch loaded

    if not collectives.is_process_group(dp_group):
        raise MicroBatchPlanError(
            f"dp_group must be None or a torch.distributed ProcessGroup (e.g. torch.distributed.group.WORLD "
            f"or one made with torch.distributed.new_group), got {type(dp_group).__name__} {dp_group!r}",
            MicroBatchPlanError.BAD_ARGUMENT,
        )


def _sync_mode(dp_group: Any, same_micro_num_in_dp: bool) -> bool:
    from .. import collectives  # torch is loaded only here, where the caller already holds a group

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
    max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Any = None,
    micro_batch_order: Any = "pipeline",
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
    raw_arguments = dict(
        max_token_len=max_token_len, num_batches_divided_by=num_batches_divided_by,
        min_num_micro_batch=min_num_micro_batch, force_group_size=force_group_size, cost_model=cost_model,
        dummy_micro_batches=dummy_micro_batches, max_samples_per_micro_batch=max_samples_per_micro_batch,
        workload_fn=workload_fn, micro_batch_order=micro_batch_order,
    )
    stage = _local_stage(get_lengths, raw_arguments, capture_unexpected=sync, synced=sync)
    if flag_problem is not None:
        stage = _LocalStage(None, None, flag_problem, flag_problem.code, stage.arguments)
    if not sync:
        if stage.problem is not None:
            raise stage.problem
        assert stage.plan is not None
        return _finish(stage, stage.plan.parts, use_dynamic_bsz_balance)

    from .. import collectives

    local = stage.plan
    # Every rank reaches this all-reduce, failing or not: see the module docstring.
    agreement = collectives.agree_on_constraints(
        proposal=local.count if local else 0,
        max_group_tokens=int(local.group_tokens.max()) if local else 0,
        num_groups=local.num_groups if local else 0,
        error_code=stage.code,
        group=dp_group,
        must_match=(stage.arguments.must_match(ordered=flag_problem is not None or use_dynamic_bsz_balance)
                    if stage.arguments else (None,) * len(_MUST_MATCH)),
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
