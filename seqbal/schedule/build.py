"""The schedule's entry point, :func:`build_dp_schedule`: ranks *and* micro-batches, no collective.

Design of the schedule: **pack first, distribute second.** Splitting the batch over ranks first
and packing each share afterwards fixes every rank's share before anyone knows how well it
packs; the ranks must then all run the count of the *worst-packing* rank, and its padding-free
waste is paid on every rank. Packing the whole batch under the cap first uses the slack of all
ranks together, so the count per rank is ``ceil(global bins / dp_size)`` instead of the maximum
of the per-rank counts: never more, and fewer on heavy-tailed data where one rank's few long
samples would otherwise force extra micro-batches on everybody. On few slots the per-rank
route's partition is aligned too and the better of the two kept (:func:`_per_rank_candidate`).

The bins are then aligned into slots (:mod:`.slots`); ``equal_samples`` and padded cost models
take their own routes (:mod:`.equal_samples`, :mod:`.padded`), all ending in the same
:class:`~seqbal.schedule.dp_schedule.DPSchedule`.
"""

from __future__ import annotations

from typing import Hashable, Optional, Sequence, Union

import numpy as np

from ..cost import CostModel, as_cost_model
from ..partition import (
    best_fit_decreasing_partitions,
    capped_balanced_partitions,
    check_int64_sums,
    karmarkar_karp,
    packing_lower_bound,
    roundup_divisible,
    smallest_feasible_partitions,
)
from ..partition import sample_cap as _sample_cap
from ..partition.packing import split_bins_to_count
from ..partition.parts import _part_sums
from ..validation import int_argument
from ..order import check_micro_batch_order
from ..workload import plan_workloads
from .divisor import _too_few_groups
from .dp_schedule import DPSchedule, SlotOrder, _group_maxima, _schedule_of
from .equal_samples import _check_equal_samples, _equal_samples_schedule
from .inputs import WorkloadFn, _groups, _lengths_array, _optional_count, raise_if_over
from .padded import _padded_model, _padded_schedule
from .slots import _aligned, _Bins, _even_slots, _polish_ranks, _ranks_within_slots, _slot_cost, _slots_from_bins


#: Up to this many micro-batches per rank, build_dp_schedule also aligns the per-rank route's
#: partition and keeps the better of the two (see :func:`build_dp_schedule`, step 3).
FEW_SLOTS = 16
#: ... and at most this many groups (the per-rank route costs ``dp_size`` capped searches).
FEW_SLOTS_MAX_GROUPS = 4096


def _per_rank_candidate(
    tokens: np.ndarray, work: np.ndarray, capacity: int, dp_size: int, divisor: int, min_count: int,
    limit: Optional[int] = None,
) -> Optional[list[list[int]]]:
    """The per-rank route as one global partition: KK split of the groups over ranks (equal
    counts when they divide), each share at its smallest feasible count (a multiple of
    ``divisor``, ``>= min_count``), every share then split up to the largest of those counts.
    ``None`` if some share cannot reach that count, or needs more than ``limit`` micro-batches
    (the caller has no use for the route then: it stops at that share instead of searching
    the others). Cost: up to ``dp_size`` capped searches on ``g / dp_size`` groups each.
    """
    g = len(tokens)
    if g < dp_size:
        return None
    shares = karmarkar_karp(work, dp_size, equal_size=g % dp_size == 0)
    plans = []
    for share in shares:
        index = np.asarray(share, dtype=np.int64)
        k, parts = smallest_feasible_partitions(tokens[index], work[index], capacity, min_count=min_count, step=divisor)
        if parts is None or (limit is not None and k > limit):
            return None
        plans.append((index, k, parts))
    count = max(k for _, k, _ in plans)
    result: list[list[int]] = []
    for index, k, parts in plans:
        if k < count:
            if count > len(index):
                return None
            parts = capped_balanced_partitions(tokens[index], work[index], capacity, count, feasible=parts)
            if parts is None:
                return None
        result.extend([int(index[i]) for i in part] for part in parts)
    return result


def build_dp_schedule(
    lengths: Sequence[int],
    dp_size: int,
    max_token_len: int,
    *,
    force_group_size: int = 1,
    group_ids: Optional[Sequence[Hashable]] = None,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    workload_fn: Optional[WorkloadFn] = None,
    cost_model: Union[None, str, CostModel] = None,
    equal_samples: bool = False,
    use_dynamic_bsz_balance: bool = True,
    max_samples_per_micro_batch: Optional[int] = None,
    micro_batch_order: str = "pipeline",
) -> DPSchedule:
    """Plan every DP rank's samples and micro-batches at once, on the driver, with no collective.

    Steps (see the module docstring for why in this order):
      1. form groups (``force_group_size`` consecutive samples, or equal ``group_ids``), which are
         never split; a sample or group over the cap is a ``ValueError`` naming it;
      2. pack the groups under the cap with best-fit decreasing; the bin count ``b`` is the
         fewest this packer finds;
      3. raise the count to ``t``, the smallest multiple of ``dp_size * num_batches_divided_by``
         that is ``>= b`` and ``>= dp_size * min_num_micro_batch`` (a smaller multiple is tried
         first if the cap admits one, down from the packing lower bound); the ``t`` micro-batches
         are balanced on workload with moves, swaps and splits that never break the cap
         (:func:`seqbal.partition.capped_balanced_partitions`). If ``t`` is above the lower bound, the per-rank route (KK split of the groups over
         ranks, each share packed at its own smallest count, all raised to the largest) is
         computed as well and wins if it needs fewer: the schedule never needs more
         micro-batches per rank than splitting first and packing per rank would;
      4. cut the ``t`` micro-batches into ``t / dp_size`` slots: sorted by workload, ``dp_size``
         consecutive ones per slot (this minimises the sum of the slots' heaviest micro-batch,
         the step time when ranks sync at every micro-batch, as FSDP does);
      5. even out every slot: single-group moves and swaps, within the cap, between a slot's
         heaviest micro-batch and another of the slot or a roomy one of another slot
         (:func:`_even_slots`);
      6. place each slot's micro-batches on the ranks, one each, so that rank totals balance
         too (what a once-per-step sync, DDP, waits for), then polish the rank totals with
         group trades inside a slot that keep every slot's maximum (:func:`_polish_ranks`);
         With at most :data:`FEW_SLOTS` micro-batches per rank (and at most
         :data:`FEW_SLOTS_MAX_GROUPS` groups), the per-rank route's partition
         goes through steps 4-6 as well, and the one with the smaller per-micro-batch step wins;
      7. order the slots, the same on every rank: with ``use_dynamic_bsz_balance`` as
         ``micro_batch_order`` says: ``"pipeline"`` is the rule of
         :func:`seqbal.plan_micro_batches` (slots sorted by workload descending, then
         ``parts[::2][::-1] + parts[1::2]``: light slots at both ends for pipeline bubbles),
         ``"largest_first"`` sorts the slots by their largest micro-batch's cost against the cap,
         largest first (for the caching allocator); without it, heaviest slot first.

    With ``equal_samples=True`` steps 2-6 become the per-rank route, aligned: the groups are
    split over the ranks in equal numbers first (KK on workload), each share is packed at the
    count every rank needs, each rank's micro-batches sorted by workload form the slots, and
    only swaps of one group for one even them out (moves would change a rank's sample count).

    Args:
        lengths: effective tokens of each sample (sequence of ints, integer array or tensor).
        dp_size: number of data-parallel ranks, >= 1.
        max_token_len: hard cap on the tokens of every micro-batch.
        force_group_size: samples ``i*g .. i*g+g-1`` stay in one micro-batch. Default 1.
        group_ids: alternatively, one hashable per sample; samples with equal ids stay in one
            micro-batch (need not be contiguous). Default None.
        num_batches_divided_by: the per-rank count must be a multiple of this (virtual pipeline
            stages). Default None.
        min_num_micro_batch: the per-rank count must be at least this. Default None.
        workload_fn: lengths -> workloads (default :func:`seqbal.calculate_workload`); float
            results are rounded to integers.
        cost_model: what ``max_token_len`` caps, as in :func:`seqbal.plan_micro_batches`:
            effective tokens (default), ``"padded"`` (``samples x longest``) or a
            :class:`~seqbal.CostModel` with rounding. Under the padded cost, steps 2-4 become:
            runs of the length-sorted groups (the fewest micro-batches for equal group sizes),
            balanced on padded workload, handed to ranks in equal numbers by KK on their
            padded workloads (no group moves between them, which could break the padded cap).
        equal_samples: every rank gets the same number of samples, as verl's equal-chunk
            dispatch (``DataProto.chunk``) needs. Requires groups of one size
            (``force_group_size``, or ``group_ids`` whose groups are all equally large) and a
            group count divisible by ``dp_size``, i.e. ``n % (dp_size * group size) == 0``;
            otherwise a ``ValueError`` with the numbers. Every other guarantee is unchanged.
            The price: the shares are fixed before packing, so the count per rank can be higher
            and the slots less even than without it (see docs/benchmarks.md, step
            efficiency). Default False.
        use_dynamic_bsz_balance: order the slots (step 7) as ``micro_batch_order`` says, as
            ``plan_micro_batches`` does. Default True; False: heaviest slot first, whatever
            ``micro_batch_order`` says.
        micro_batch_order: ``"pipeline"`` (default: light slots at both ends) or
            ``"largest_first"`` (the slot whose largest micro-batch costs most first: the
            allocator reserves its largest blocks once). Slot ``i`` holds similar work on every
            rank either way; only the order of the slots changes (:mod:`seqbal.order`).
        max_samples_per_micro_batch: a second hard cap, on the samples of every micro-batch (a
            group counts its samples). The count starts at the bound on samples
            (:func:`seqbal.partition.sample_cap.sample_count_bound`), the partition of step 3 is
            made to meet it (repaired, else dealt in snake order, else peeled or split:
            :mod:`seqbal.partition.sample_cap`, raising the count only there), and steps 5-6 keep it: their moves are dropped where they
            would break it (swaps only for groups of one size, else no evening). Under the
            padded cost, runs over it are split. With ``equal_samples`` (groups of one size)
            each rank's share is planned under both caps and only swaps even the slots, which
            keep every micro-batch's sample count. Default None (no cap).

    Returns:
        A :class:`DPSchedule`. Guarantees: the same count on every rank; every sample exactly
        once; every micro-batch ``<= max_token_len`` tokens and non-empty; groups never split;
        per rank the micro-batches tile ``rank_indices`` in order; at most
        ``max_samples_per_micro_batch`` samples per micro-batch when given; the count a multiple of
        ``num_batches_divided_by`` and ``>= min_num_micro_batch``; with ``equal_samples`` the
        same sample count on every rank; deterministic. :meth:`DPSchedule.step_efficiency`
        reports how even the slots and the ranks are.

    Raises:
        ValueError: bad arguments; a sample or group over the cap; more micro-batches needed
            than there are groups (the message says which setting to change, and to what);
            ``equal_samples`` with unequal groups or a sample count not divisible by
            ``dp_size * group size``.

    Complexity: O(n log n) packing plus one or two capped-balancing passes (O(n t log t)), when
    ``t`` is above the bound ``dp_size`` more on ``n / dp_size`` groups each, and the slot
    evening (at most ``SLOT_BUDGET_PER_SLOT * t / dp + 64`` vectorised steps). At 32,768
    samples on 32 ranks: 0.1-0.8 s, 3-22 best-fit-decreasing passes on the same lengths, most
    of it the slot evening (``python benchmarks/bench_schedule.py --planning-cost``).

    Examples:
        24 tokens under a cap of 8 pack into 3 micro-batches; 2 ranks need a multiple of 2, so
        the count is rounded up to 4 (2 per rank) and one bin is split:

        >>> s = build_dp_schedule([6, 2, 5, 3, 4, 4], dp_size=2, max_token_len=8)
        >>> s.num_micro_batches, s.micro_batches, s.rank_indices
        (2, (((0,), (1, 4)), ((3, 5), (2,))), ((0, 1, 4), (3, 5, 2)))

        Slot 0 holds micro-batches of 6 and 8 tokens, slot 1 of 6 and 5: each slot pairs similar
        work. With ``equal_samples=True`` every rank gets 3 of the 6 samples:

        >>> [len(r) for r in build_dp_schedule([6, 2, 5, 3, 4, 4], 2, 8, equal_samples=True).rank_indices]
        [3, 3]
    """
    array = _lengths_array(lengths)
    dp_size = int_argument("dp_size", dp_size)  # Python ints: NumPy scalars would wrap (uint8) below
    max_token_len = int_argument("max_token_len", max_token_len)
    num_batches_divided_by = _optional_count("num_batches_divided_by", num_batches_divided_by)
    min_num_micro_batch = _optional_count("min_num_micro_batch", min_num_micro_batch)
    cost = as_cost_model(cost_model)
    groups = _groups(len(array), force_group_size, group_ids)
    for name, flag in (("equal_samples", equal_samples), ("use_dynamic_bsz_balance", use_dynamic_bsz_balance)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    micro_batch_order = check_micro_batch_order(micro_batch_order)
    if equal_samples:
        _check_equal_samples(len(array), groups, dp_size, force_group_size)
    max_samples = _check_sample_cap(max_samples_per_micro_batch, groups, group_ids)
    measured = cost.sample_costs(array)  # what each sample counts for under the cost model
    check_int64_sums(measured)  # token totals; the default workloads are kept within int64 below
    lengths_for_work = measured if cost.memory is None else cost.rounded(array)  # bytes are not compute
    work = plan_workloads(lengths_for_work, workload_fn)
    check_int64_sums(measured, work)

    order = SlotOrder(micro_batch_order if use_dynamic_bsz_balance else None, measured, cost.padded)
    capacity = cost.sample_capacity(max_token_len)
    under = "" if cost.is_default else f" under the {cost}"
    raise_if_over(measured, capacity, lambda index, count: (
        f"sample {index} has {int(array[index])} tokens{under}, which exceeds max_token_len={max_token_len} "
        f"({count} sample(s) over the cap, the largest has {int(array.max())}): raise max_token_len "
        f"to at least {int(measured.max()) + max_token_len - capacity} or truncate those samples"
    ))
    if len(groups) == len(array):  # a group per sample, in sample order: the sums are the values
        group_tokens, group_work = measured.astype(np.int64), work.astype(np.int64)
    else:
        group_tokens = _part_sums(measured, groups)  # one NumPy pass each (exact: the guard above)
        group_work = _part_sums(work, groups)
    group_costs = group_tokens
    if cost.padded:  # a group costs its samples x its longest; only the padded route needs these
        group_sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
        group_longest = _group_maxima(measured, groups, group_sizes)
        group_costs = group_sizes * group_longest
    kind = "forced group" if group_ids is None else "group"
    raise_if_over(group_costs, capacity, lambda index, _: (
        f"{kind} exceeds max_token_len: group {index} (samples {groups[index]}) "
        f"{f'costs {int(group_costs[index])}{under}' if under else f'has {int(group_costs[index])} tokens'} "
        f"> max_token_len={max_token_len}; raise max_token_len "
        f"to at least {int(group_costs.max())} or use smaller groups"
    ))
    capacity = max(capacity, 1)  # below the packed rounding only empty samples are left: any cap fits

    step = dp_size * (num_batches_divided_by or 1)
    floor = dp_size * (min_num_micro_batch or 1)
    group_samples = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
    if max_samples is not None:  # no partition has fewer parts: the search starts there
        floor = max(floor, _sample_cap.sample_count_bound(group_samples, max_samples))
    if equal_samples:
        padded = (group_sizes, group_longest, _padded_model(workload_fn)) if cost.padded else None
        return _equal_samples_schedule(
            array, work, groups, group_tokens, group_work, capacity, dp_size, max_token_len,
            num_batches_divided_by or 1, min_num_micro_batch or 1, padded, order, max_samples,
        )
    if cost.padded:
        return _padded_schedule(
            array, work, groups, group_sizes, group_longest, capacity, dp_size, step, floor, max_token_len,
            num_batches_divided_by, min_num_micro_batch, workload_fn, order, max_samples,
        )
    packing = best_fit_decreasing_partitions(group_tokens, capacity)
    target = roundup_divisible(max(len(packing), floor), step)
    # A smaller multiple of ``step`` may still be feasible when the packer left slack: try the
    # counts from the packing lower bound up (usually none or one, since step >= dp_size).
    parts: Optional[list[list[int]]] = None
    bound = roundup_divisible(max(packing_lower_bound(group_tokens, capacity), floor), step)
    count = bound
    while count < target and count <= len(groups) and parts is None:
        parts = capped_balanced_partitions(group_tokens, group_work, capacity, count)
        if parts is None:
            count += step
    if parts is None and target <= len(groups):
        count = target
        parts = capped_balanced_partitions(group_tokens, group_work, capacity, count, feasible=packing)
    if (parts is None or count > bound) and dp_size > 1:
        # Not provably optimal: the per-rank route (split, then pack each share) is a candidate
        # too, so the schedule never needs more micro-batches per rank than that route.
        # (it replaces ``parts`` only with fewer micro-batches per rank: ``count`` is a multiple of dp_size)
        alternative = _per_rank_candidate(
            group_tokens, group_work, capacity, dp_size, num_batches_divided_by or 1, min_num_micro_batch or 1,
            limit=None if parts is None else count // dp_size - 1,
        )
        if alternative is not None and (parts is None or len(alternative) < count):
            parts, count = alternative, len(alternative)
    if parts is None:
        raise _too_few_groups(
            target, len(packing), len(groups), dp_size, max_token_len, num_batches_divided_by, min_num_micro_batch
        )
    if parts is None or len(parts) != count:  # step 4 of capped_balanced_partitions guarantees this
        raise RuntimeError(f"internal error: no cap-respecting partition into {count} parts; please report")
    if max_samples is not None:
        repaired, fixed = _sample_cap.repair_sample_cap(parts, group_tokens, group_samples, capacity, max_samples)
        dealt = None if fixed else _sample_cap.dealt_within_caps(group_tokens, group_samples, capacity, max_samples, count)
        parts = repaired if fixed else dealt or _sample_cap.capped_pieces(
            repaired, group_tokens, group_samples, capacity, max_samples, repaired=True
        )
        if len(parts) > count:  # the repair could not keep the count: split up to the next multiple
            count = roundup_divisible(len(parts), step)
            if count > len(groups):
                raise _too_few_groups(
                    count, len(parts), len(groups), dp_size, max_token_len, num_batches_divided_by, min_num_micro_batch
                )
            parts = split_bins_to_count(parts, group_tokens, count, weights=group_work)
        parts, grid = _aligned_within_samples(parts, group_tokens, group_work, group_samples, capacity, dp_size, max_samples)
        bin_work = _part_sums(group_work, parts)
        return _schedule_of(array, work, groups, parts, grid, bin_work, dp_size, max_token_len, order)

    # Cut the micro-batches into slots of similar work, even out each slot with group moves and
    # swaps, then place each slot's micro-batches on ranks so that rank totals are even too.
    parts, grid = _aligned(parts, group_tokens, group_work, capacity, dp_size)
    if dp_size > 1 and count // dp_size <= FEW_SLOTS and len(groups) <= FEW_SLOTS_MAX_GROUPS:
        # With few slots each one weighs a lot, and the slot evening can stall a few millionths
        # short of the per-rank route (split first, pack each share): align that one as well
        # (cheap here) and keep whichever has the faster per-micro-batch step.
        alternative = _per_rank_candidate(
            group_tokens, group_work, capacity, dp_size, num_batches_divided_by or 1, min_num_micro_batch or 1,
            limit=count // dp_size,
        )
        if alternative is not None and len(alternative) == count:
            other = _aligned(alternative, group_tokens, group_work, capacity, dp_size)
            if _slot_cost(other[0], other[1], group_work) < _slot_cost(parts, grid, group_work):
                parts, grid = other
    bin_work = _part_sums(group_work, parts)
    return _schedule_of(array, work, groups, parts, grid, bin_work, dp_size, max_token_len, order)


def _check_sample_cap(
    max_samples: Optional[int], groups: list[list[int]], group_ids: Optional[Sequence[Hashable]],
) -> Optional[int]:
    """``max_samples_per_micro_batch`` as an int (None stays None), or the ``ValueError``: not a
    positive int, or a group of more samples."""
    if max_samples is None:
        return None
    max_samples = int_argument("max_samples_per_micro_batch", max_samples, expected="None or a positive int")
    largest = max(range(len(groups)), key=lambda g: (len(groups[g]), -g))
    if len(groups[largest]) > max_samples:
        kind = "forced group" if group_ids is None else "group"
        raise ValueError(
            f"{kind} of {len(groups[largest])} samples exceeds max_samples_per_micro_batch={max_samples}: group "
            f"{largest} (samples {groups[largest]}) must share a micro-batch; raise max_samples_per_micro_batch to at "
            f"least {len(groups[largest])} or use smaller groups"
        )
    return max_samples


def _aligned_within_samples(
    parts: list[list[int]], tokens: np.ndarray, work: np.ndarray, samples: np.ndarray, capacity: int, dp_size: int,
    max_samples: int, budget: Optional[int] = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Steps 4-6 on a partition that meets the sample cap, keeping it (the evening at most
    ``budget`` trade attempts where given). Where every group has as
    many samples, a swap keeps every micro-batch's sample count, so the evening and the polish
    run with swaps only; otherwise the full alignment runs and is kept where it happens to keep
    the cap, else the slots and ranks are formed with no evening. The cap holds either way."""
    parts = sorted(sorted(part) for part in parts)
    slots = _slots_from_bins(parts, _part_sums(work, parts), dp_size)
    if len(samples) and bool((samples == samples[0]).all()):
        bins = _Bins(parts, tokens, work, capacity, moves=False)
        _even_slots(bins, slots, budget)
        grid = _ranks_within_slots(slots, bins.bin_work, dp_size)
        _polish_ranks(bins, grid)
        return bins.parts, grid
    aligned = _aligned(parts, tokens, work, capacity, dp_size, budget)
    if _sample_cap.within_sample_cap(aligned[0], samples, max_samples):
        return aligned
    return parts, _ranks_within_slots(slots, _part_sums(work, parts), dp_size)
