"""``equal_samples=True``: every rank gets the same number of samples (verl dispatches equal chunks).

The groups are split over ranks first, in equal numbers, and each share is packed: the
pack-first advantage is given up for equal sample counts, and only count-preserving swaps even
the slots out. The sample counts are checked (:func:`_check_equal_samples`) before any planning.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..cost import padded_min_count, padded_partitions
from ..partition import (
    capped_balanced_partitions,
    karmarkar_karp,
    roundup_divisible,
    smallest_feasible_partitions,
)
from ..partition import sample_cap as _sample_cap
from ..partition.packing import split_bins_to_count
from ..partition.parts import _part_sums
from .dp_schedule import DPSchedule, SlotOrder, _schedule_of
from .padded import _padded_work
from .slots import _Bins, _even_slots, _polish_ranks


def _check_equal_samples(n: int, groups: list[list[int]], dp_size: int, force_group_size: int) -> None:
    """``equal_samples=True`` needs groups of one size whose count divides by ``dp_size``."""
    sizes = sorted({len(group) for group in groups})
    if len(sizes) > 1:
        first = next(i for i, group in enumerate(groups) if len(group) != len(groups[0]))
        raise ValueError(
            f"equal_samples=True needs groups of one size, but group 0 has {len(groups[0])} samples and group "
            f"{first} has {len(groups[first])} (sizes {sizes}): make every uid group the same size or pass "
            f"equal_samples=False"
        )
    if len(groups) % dp_size:
        size = sizes[0]
        what = f"dp_size = {dp_size}" if size == 1 else f"dp_size * group size = {dp_size} * {size} = {dp_size * size}"
        raise ValueError(
            f"equal_samples=True: {n} samples cannot be split evenly over dp_size={dp_size} ranks "
            f"({n} % ({what}) = {n % (dp_size * size)}): pass a batch whose sample count is a multiple of "
            f"{dp_size * size}, or equal_samples=False"
        )


def _equal_samples_schedule(
    array: np.ndarray,
    work: np.ndarray,
    groups: list[list[int]],
    group_tokens: np.ndarray,
    group_work: np.ndarray,
    capacity: int,
    dp_size: int,
    max_token_len: int,
    divisor: int,
    min_count: int,
    padded: Optional[tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], np.ndarray]]],
    order: SlotOrder,
    max_samples: Optional[int] = None,
) -> DPSchedule:
    """build_dp_schedule with ``equal_samples=True``: split, then pack each share, then align.

    The groups (all of one size) are split over the ranks first, equal group counts balanced on
    workload by KK (what verl's equal-chunk dispatch of a balanced batch gives); each share is
    packed at the count every rank needs (the largest of the shares' smallest feasible counts,
    the others split up to it); each rank's micro-batches are sorted by workload and slot ``i``
    takes the ``i``-th of every rank, then swaps of one group for one between a slot's
    micro-batches even it out (a swap keeps both ranks' sample counts). ``padded`` is
    ``(group_sizes, group_longest, model)`` under the padded cost, where no group moves.

    ``max_samples`` (``max_samples_per_micro_batch``): every group has the same number of
    samples, so a share's micro-batches hold at most ``max_samples // group size`` groups. Each
    share's count starts at that bound, its plan is made to meet the cap
    (:func:`seqbal.partition.sample_cap.capped_pieces`; the padded cost's fewest runs,
    :func:`seqbal.partition.sample_cap.padded_runs`), and a share raised to the common count
    keeps its balanced plan only where it meets the cap (repaired at that count), else its own
    plan is split up to the count (a piece keeps both caps). The swaps of the evening keep every
    micro-batch's group count, so the cap holds to the end."""
    shares = [np.asarray(sorted(share), dtype=np.int64) for share in karmarkar_karp(group_work, dp_size, equal_size=True)]
    per_share = len(shares[0])
    group_samples = np.full(len(group_work), len(groups[0]) if groups else 1, dtype=np.int64)
    if max_samples is not None:  # no share has fewer micro-batches than its groups need on samples
        min_count = max(min_count, _sample_cap.sample_count_bound(group_samples[shares[0]], max_samples))

    sample_cap = "" if max_samples is None else f" and max_samples_per_micro_batch={max_samples}"

    def too_few(needed: int) -> ValueError:
        return ValueError(
            f"Cannot satisfy max_token_len={max_token_len} with equal_samples=True: every rank needs {needed} "
            f"micro-batches (to respect the cap{sample_cap}, a multiple of num_batches_divided_by={divisor}, at least "
            f"min_num_micro_batch={min_count}) but each rank's share has only {per_share} group(s); raise "
            f"max_token_len, lower num_batches_divided_by or min_num_micro_batch, use a smaller dp_size, or "
            f"pass equal_samples=False"
        )

    if padded is not None:
        sizes, longest, model = padded
        if max_samples is None:
            fewest = max(padded_min_count(longest[share], sizes[share], capacity) for share in shares)
        else:  # runs of the sorted groups: the fewest under both caps, groups being of one size
            runs = [_sample_cap.padded_runs(longest[share], sizes[share], capacity, max_samples) for share in shares]
            fewest = max(len(share_runs) for share_runs in runs)
        count = roundup_divisible(max(fewest, min_count), divisor)
        if count > per_share:
            raise too_few(count)
        plans = [padded_partitions(longest[share], sizes[share], capacity, count, workload_fn=model) for share in shares]
        if max_samples is not None:
            plans = [
                plan if plan is not None and _sample_cap.within_sample_cap(plan, sizes[share], max_samples)
                else split_bins_to_count(share_runs, longest[share] * sizes[share], count)
                for share, plan, share_runs in zip(shares, plans, runs)
            ]
        if any(plan is None or len(plan) != count for plan in plans):
            raise RuntimeError(f"internal error: no padded partition into {count} parts; please report")
    else:
        searched = [
            smallest_feasible_partitions(group_tokens[share], group_work[share], capacity, min_count=min_count, step=divisor)
            for share in shares
        ]
        if max_samples is not None:  # each share's own plan made to meet the sample cap (more parts at worst)
            searched = [
                _capped_search(group_tokens[share], group_samples[share], capacity, max_samples, divisor, k, plan)
                for share, (k, plan) in zip(shares, searched)
            ]
        count = max(k for k, _ in searched)
        if count > per_share or any(plan is None for _, plan in searched):
            raise too_few(count)
        plans = [
            plan if len(plan) == count else _raised(group_tokens[share], group_work[share], group_samples[share], capacity,
                                                    max_samples, count, plan)
            for share, (k, plan) in zip(shares, searched)
        ]
        if any(plan is None or len(plan) != count for plan in plans):  # feasible= makes this succeed
            raise RuntimeError(f"internal error: no cap-respecting partition into {count} parts; please report")
    rank_parts = [sorted(sorted(int(share[i]) for i in part) for part in plan) for share, plan in zip(shares, plans)]
    parts = [part for plan in rank_parts for part in plan]

    def weigh(parts: list[list[int]]) -> list[int]:
        return _padded_work(parts, *padded) if padded is not None else _part_sums(group_work, parts).tolist()

    bin_work = weigh(parts)
    columns = []
    for rank in range(dp_size):
        own = range(rank * count, (rank + 1) * count)
        columns.append(sorted(own, key=lambda b: (-bin_work[b], parts[b][0])))
    grid = [[columns[r][s] for r in range(dp_size)] for s in range(count)]
    if padded is None:
        bins = _Bins(parts, group_tokens, group_work, capacity, moves=False)  # swaps keep every rank's samples
        _even_slots(bins, grid)
        _polish_ranks(bins, grid)
        parts, bin_work = bins.parts, weigh(bins.parts)
    return _schedule_of(array, work, groups, parts, grid, bin_work, dp_size, max_token_len, order)


def _capped_search(
    tokens: np.ndarray, samples: np.ndarray, capacity: int, max_samples: int, divisor: int, count: int,
    plan: Optional[list[list[int]]],
) -> tuple[int, Optional[list[list[int]]]]:
    """A share's searched ``(count, plan)`` made to meet the sample cap: the plan repaired, else
    peeled or split (:func:`seqbal.partition.sample_cap.capped_pieces`), and the count raised to
    its parts, a multiple of ``divisor``. A count beyond the share's groups stays as it is."""
    if plan is None:
        return count, None
    plan = _sample_cap.capped_pieces(plan, tokens, samples, capacity, max_samples)
    return max(count, roundup_divisible(len(plan), divisor)), plan


def _raised(
    tokens: np.ndarray, work: np.ndarray, samples: np.ndarray, capacity: int, max_samples: Optional[int], count: int,
    plan: list[list[int]],
) -> Optional[list[list[int]]]:
    """A share's plan at the common ``count`` (more parts than ``plan``): balanced at that count
    from ``plan``; under the sample cap, :func:`seqbal.partition.sample_cap.raised_within_caps`
    (that balance repaired at the same count, else ``plan`` itself split up to the count, a
    piece keeping both caps: why the largest of the shares' counts is reachable by every
    share). Balanced and split on the true workloads: every group holds the same number of
    samples here."""
    if max_samples is None:
        return capped_balanced_partitions(tokens, work, capacity, count, feasible=plan)
    return _sample_cap.raised_within_caps(plan, count, tokens, samples, capacity, max_samples,
                                          balance_work=work, split_weights=work)
