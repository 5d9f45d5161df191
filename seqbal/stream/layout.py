"""Lay a step's micro-batches out as ``[rank][slot]``: the same count on every rank, slot i
carrying similar work on every rank.

FSDP-style trainers wait for the slowest rank at every micro-batch, so what matters is each
slot's heaviest micro-batch, not only the rank totals. When every micro-batch holds something
and the cost is in tokens, this reuses the global schedule's alignment
(:mod:`seqbal.schedule.slots`: slots of similar workload, evened out with group moves and swaps
within the cap, then placed on ranks so that rank totals balance too). Otherwise (padded cost,
where a move could break the cap; or a flush with fewer groups than micro-batches) the slots
are only cut from the micro-batches sorted by workload and placed on ranks, with no moves;
the empty (dummy) micro-batches weigh nothing, so they sort into the last slots.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..partition.parts import _part_sums
from ..schedule.build import _aligned_within_samples
from ..schedule.dp_schedule import _slot_order
from ..schedule.slots import _aligned, _ranks_within_slots


def layout_bins(
    parts: list[list[int]],
    tokens: np.ndarray,
    work: np.ndarray,
    samples: np.ndarray,
    capacity: int,
    ranks: int,
    per_rank: int,
    *,
    padded: bool = False,
    max_samples: Optional[int] = None,
    even: bool = True,
    budget: Optional[int] = None,
    order: str = "pipeline",
    longest: Optional[np.ndarray] = None,
) -> list[list[list[int]]]:
    """``[rank][slot]`` -> group positions, for ``parts`` (at most ``ranks * per_rank`` lists of
    group positions; missing or empty ones become dummies).

    Args:
        parts: the micro-batches, as lists of group positions.
        tokens: each group's (rounded) tokens; the evening keeps every micro-batch within
            ``capacity`` on these.
        work: each group's workload (what the slots balance).
        samples: each group's sample count (the sample cap).
        capacity: the token capacity of a micro-batch.
        ranks, per_rank: the grid's shape.
        padded: the cost is padded: no group moves.
        max_samples: the cap on samples per micro-batch, or None.
        even: run the slot evening (group moves and swaps); False: slots cut from the sorted
            micro-batches and placed on ranks only, at a fraction of the cost.
        budget: at most this many trade attempts in the evening (each a few small NumPy
            steps); None: the evening's own bound (:data:`seqbal.schedule.slots.SLOT_BUDGET_PER_SLOT`).
        order: ``micro_batch_order``: ``"pipeline"`` or ``"largest_first"`` (:mod:`seqbal.order`;
            a micro-batch's size is the sum of its ``tokens``, or under ``padded`` its samples x
            its groups' ``longest``).
        longest: each group's longest (rounded) sample; needed for ``"largest_first"`` under ``padded``.

    Returns:
        ``ranks`` lists of ``per_rank`` lists; slots (micro-batches of similar work, one per
        rank) in ``order`` when nothing is empty, else heaviest first (largest first with
        ``"largest_first"``), dummies last.
        O(t log t) for ``t = ranks * per_rank`` micro-batches, plus the evening.
    """
    total = ranks * per_rank
    full = len(parts) == total and all(parts)

    def sizes(bins: list[list[int]]) -> Optional[list[int]]:
        if order != "largest_first":
            return None
        if padded:
            assert longest is not None
            return [int(samples[b].sum()) * int(longest[b].max()) if len(b) else 0 for b in bins]
        return _part_sums(tokens, bins).tolist()

    if full and not padded and ranks > 1 and even:
        if max_samples is None:
            parts, grid = _aligned(parts, tokens, work, capacity, ranks, budget)
        else:
            parts, grid = _aligned_within_samples(parts, tokens, work, samples, capacity, ranks, max_samples, budget)
    else:
        parts = [sorted(p) for p in parts] + [[] for _ in range(total - len(parts))]
        bin_work = _part_sums(work, parts).tolist()
        bin_size = sizes(parts)
        # heaviest first, the empty ones last whatever the workloads (a zero-length sample weighs 0)
        ranked = sorted(range(total), key=lambda b: (not parts[b], -bin_work[b], parts[b][0] if parts[b] else 0))
        slots = [ranked[start:start + ranks] for start in range(0, total, ranks)]
        grid = _ranks_within_slots(slots, bin_work, ranks)
        if full:  # the same slot order as every other plan
            slot_order = _slot_order(grid, bin_work, order, bin_size)
            return [[list(parts[grid[s][r]]) for s in slot_order] for r in range(ranks)]
        # a flush: heaviest slot first (largest first with "largest_first"), dummies last either way
        slot_order = _slot_order(grid, bin_work, order, bin_size) if bin_size is not None else range(per_rank)
        return [[list(parts[grid[s][r]]) for s in slot_order] for r in range(ranks)]
    slot_order = _slot_order(grid, _part_sums(work, parts), order, sizes(parts))
    return [[list(parts[grid[s][r]]) for s in slot_order] for r in range(ranks)]
