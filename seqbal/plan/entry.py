"""The public entry points: :func:`plan_micro_batches` and :func:`plan_data_parallel`.

Both decide on plain lengths and need only NumPy; :func:`seqbal.rearrange.rearrange_micro_batches`
adds reading the lengths from a TensorDict and copying each micro-batch out of it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from ..cost import CostModel
from ..partition import roundup_divisible
from .agreement import _cannot_satisfy_agreed, _plan
from .arguments import _as_flag
from ..workload import WorkloadFn
from .errors import LengthsLike, MicroBatchPlanError
from .local import _finish, _local_stage, _try_partition


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
    max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[WorkloadFn] = None,
    micro_batch_order: str = "pipeline",
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
        use_dynamic_bsz_balance: order the micro-batches as ``micro_batch_order`` says; False
            keeps the partitioner's order, whatever ``micro_batch_order`` says. Default True.
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
        max_samples_per_micro_batch: a second hard cap, on the samples (sequences) of every
            micro-batch, for kernels and buffers that grow with the sequence count. A forced
            group of ``g`` samples counts ``g``, so a micro-batch holds at most
            ``max_samples_per_micro_batch // g`` groups. Must be the same on every rank of
            ``dp_group``. Default None (no cap; plans exactly as without it).
        workload_fn: what the micro-batches balance: an int64 array of lengths -> one
            non-negative workload per length (integers, or floats rounded once), e.g.
            :func:`seqbal.make_workload_fn` or a fitted time model. Default None:
            :func:`seqbal.calculate_workload`. The cap is unaffected. Must be the same model on
            every rank of ``dp_group`` (compared by a digest of its workloads on fixed probe
            lengths, in the agreement's first all-reduce).
        micro_batch_order: with ``use_dynamic_bsz_balance``, ``"pipeline"`` (default: heaviest
            in the middle, lightest at both ends, see :func:`order_for_pipeline`) or
            ``"largest_first"`` (largest cost against the cap first, so the caching allocator
            reserves its largest blocks once; :mod:`seqbal.order`). Must be the same on every
            rank of ``dp_group``.

    Returns:
        One ascending list of sample indices per micro-batch; together they hold every index
        exactly once; no list is empty; every micro-batch costs at most ``max_token_len``
        (effective tokens by default, else under ``cost_model``) and holds at most
        ``max_samples_per_micro_batch`` samples when that is given;
        the count is at least ``ceildiv(total, max_token_len)``,
        ``ceildiv(groups, max_samples_per_micro_batch // force_group_size)`` (with the sample
        cap) and ``min_num_micro_batch``, a
        multiple of ``num_batches_divided_by``, and in sync mode equal on every rank.
        Deterministic. Cost: O(n log n) plus a few partitioning passes; in sync mode exactly two
        all-reduces. With ``dummy_micro_batches``, the lists after the real ones may be empty
        (dummies); every guarantee holds for the real ones, and the count (dummies included)
        is the agreed one.

    Integer arguments may be any integral type (``np.uint32(2)`` is 2); each must fit in int64,
    and ``bool`` is rejected.

    Raises:
        ValueError: (:class:`MicroBatchPlanError`) invalid arguments, an empty batch, a negative
            length, a sample or forced group over the cap, a forced group of more samples than
            ``max_samples_per_micro_batch`` (``forced group of G samples exceeds
            max_samples_per_micro_batch=M``), or a count that cannot be formed
            (``Cannot satisfy max_token_len ...``). In sync mode every rank raises together; if
            the ranks passed different ``max_token_len``, ``num_batches_divided_by``,
            ``force_group_size``, ``cost_model``, ``max_samples_per_micro_batch``,
            ``workload_fn`` or ``micro_batch_order``, every rank
            raises the same error saying so. A ``dp_group``
            that is not None or a ProcessGroup is an error before any collective.

    Examples:
        >>> plan_micro_batches([7] * 8, max_token_len=8)  # ceildiv(56, 8) = 7 is only a bound
        [[1], [3], [5], [7], [6], [4], [2], [0]]
        >>> plan_micro_batches([3, 5, 2, 6], max_token_len=8, use_dynamic_bsz_balance=False)
        [[2, 3], [0, 1]]
        >>> plan_micro_batches([6, 1, 1, 1, 5, 1], max_token_len=12, cost_model="padded")  # 2 x 6, 4 x 1
        [[0, 4], [1, 2, 3, 5]]
        >>> plan_micro_batches([1] * 6, max_token_len=100, max_samples_per_micro_batch=4)  # ceildiv(6, 4) = 2
        [[1, 2, 4], [0, 3, 5]]
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
        max_samples_per_micro_batch,
        workload_fn,
        micro_batch_order,
    )


def plan_data_parallel(
    rank_seq_lens: Sequence[LengthsLike],
    max_token_len: int,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    cost_model: Union[None, str, CostModel] = None,
    *,
    max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[WorkloadFn] = None,
    micro_batch_order: str = "pipeline",
) -> list[list[list[int]]]:
    """What synced data-parallel ranks would decide, computed in one process, no collective.

    ``rank_seq_lens[r]`` is the effective lengths rank ``r`` would pass to
    :func:`plan_micro_batches` with a ``dp_group`` of ``len(rank_seq_lens)`` ranks. The same
    protocol runs with the all-reduces replaced by a max/min over the list, so the result is
    exactly what each rank would get: use it to check a length distribution, a cap and a
    data-parallel size before launching (the ``seqbal plan --dp N`` command does).
    ``max_samples_per_micro_batch`` caps the samples of every micro-batch of every rank, as in
    :func:`plan_micro_batches` (default None: no cap); ``workload_fn`` and ``micro_batch_order``
    are those of :func:`plan_micro_batches` (one model and one order for every rank).

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
    raw_arguments = dict(
        max_token_len=max_token_len, num_batches_divided_by=num_batches_divided_by,
        min_num_micro_batch=min_num_micro_batch, force_group_size=force_group_size, cost_model=cost_model,
        max_samples_per_micro_batch=max_samples_per_micro_batch, workload_fn=workload_fn,
        micro_batch_order=micro_batch_order,
    )
    stages = [
        _local_stage((lambda lengths=lengths: lengths), raw_arguments, capture_unexpected=False)
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
