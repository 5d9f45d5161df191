"""Fill a fixed number of capped micro-batches from a pool of groups, oldest first.

A trainer with a fixed count (``K`` micro-batches on each of ``R`` ranks) wants every step as
full as the cap allows, and no sample left behind for ever. Exact maximum filling is a
multiple-knapsack problem; this is a greedy in three phases, each a best fit (a group goes to
the fullest micro-batch it still fits in, so large holes stay open for large groups):

0. **fast path** (token cost, no sample cap): one best-fit-decreasing pass over the oldest
   groups up to the step's capacity in tokens; if they fit in ``count`` micro-batches, they are
   the step so far (phases 1 and 2 are then done);
1. **the oldest groups, mandatory**: the ``mandatory`` oldest groups (at most one per
   micro-batch) in decreasing size. Best fit opens an empty micro-batch only when a group fits
   nowhere else, and each group fits alone, so all of them are always placed: this is what
   bounds every group's wait (:class:`seqbal.StepPlanner`'s ``max_wait_steps``);
2. **a window of the next oldest groups**, as many as the room left could hold, in decreasing
   size (best-fit decreasing packs much tighter than arrival order); those that do not fit wait;
3. **younger groups into the gaps**, in arrival order, skipping those that fit nowhere; the
   scan stops as soon as no micro-batch has room for the smallest group left.

Phase 3 is where a large pool would cost: the groups that cannot fit any micro-batch's room
are dropped in one vectorised comparison first, and the loop only visits the others. Cost:
O(p) NumPy work on a pool of ``p`` groups plus O(c log c) for the ``c`` groups visited, each
placement an O(bins) vectorised best-fit.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..partition.packing import _best_fit_decreasing


class _Bins:
    """``count`` micro-batches under one cost model: token cost (rounded tokens summed, against
    ``capacity``) or padded cost (``samples x longest``), and an optional cap on samples.

    Plain Python lists: a step has tens to hundreds of micro-batches, where a loop over them
    costs less than the call overhead of the NumPy operations it would replace."""

    def __init__(self, count: int, capacity: int, padded: bool, max_samples: Optional[int]) -> None:
        self.capacity = capacity
        self.padded = padded
        self.unlimited = max_samples is None
        self.max_samples = max_samples if max_samples is not None else np.iinfo(np.int64).max // 4
        self.load = [0] * count  # token cost, or padded cost
        self.samples = [0] * count
        self.longest = [0] * count
        self.members: list[list[int]] = [[] for _ in range(count)]

    def _best(self, cost: int, samples: int, longest: int) -> tuple[int, int]:
        """(micro-batch, its cost after) of the best fit, or (-1, -1). O(count)."""
        best, best_after = -1, -1
        capacity, limit, padded = self.capacity, self.max_samples, self.padded
        for b, (load, count, top) in enumerate(zip(self.load, self.samples, self.longest)):
            count += samples
            if count > limit:
                continue
            after = count * (top if top > longest else longest) if padded else load + cost
            if best_after < after <= capacity:
                best, best_after = b, after
        return best, best_after

    def place(self, group: int, cost: int, samples: int, longest: int) -> bool:
        """Best fit: the group joins the fullest micro-batch it fits in (lowest index on ties);
        False, and nothing changes, if it fits in none."""
        target, after = self._best(cost, samples, longest)
        if target < 0:
            return False
        self.load[target] = after
        self.samples[target] += samples
        self.longest[target] = max(self.longest[target], longest)
        self.members[target].append(group)
        return True

    def could_fit(self, cost: np.ndarray, samples: np.ndarray, longest: np.ndarray) -> np.ndarray:
        """For each group, whether some micro-batch has room for it now. O(groups * bins) for the
        padded cost (in blocks), O(groups) per distinct sample count of the bins otherwise."""
        load = np.asarray(self.load, dtype=np.int64)
        counts = np.asarray(self.samples, dtype=np.int64)
        if not self.padded:
            room = self.capacity - load
            if self.unlimited:
                return cost <= room.max()
            best = np.zeros(len(cost), dtype=bool)
            for b in np.unique(counts):  # a group needs its cost and its samples to fit the same bin
                open_ = counts == b
                best |= (cost <= room[open_].max()) & (samples + b <= self.max_samples)
            return best
        top = np.asarray(self.longest, dtype=np.int64)
        out = np.zeros(len(cost), dtype=bool)
        for start in range(0, len(cost), 4096):
            s = samples[start:start + 4096, None] + counts[None, :]
            after = s * np.maximum(longest[start:start + 4096, None], top[None, :])
            out[start:start + 4096] = ((after <= self.capacity) & (s <= self.max_samples)).any(axis=1)
        return out

    def full_for(self, cost: int, samples: int, longest: int) -> bool:
        """True when no micro-batch could take a group at least this small in every respect
        (smallest cost, fewest samples, shortest longest): a lower bound on what any group adds."""
        return self._best(cost, samples, longest)[0] < 0


def fill_bins(
    cost: np.ndarray,
    samples: np.ndarray,
    longest: np.ndarray,
    count: int,
    capacity: int,
    *,
    mandatory: int,
    padded: bool = False,
    max_samples: Optional[int] = None,
) -> list[list[int]]:
    """Fill ``count`` micro-batches from groups given in arrival order (see the module docstring).

    Args:
        cost: each group's cost alone (token cost: its rounded tokens; padded cost: samples x
            longest), int64, in arrival order. Every group must fit a micro-batch alone.
        samples: each group's number of samples.
        longest: each group's longest (rounded) sample; used by the padded cost.
        count: the number of micro-batches to fill, >= ``mandatory``.
        capacity: the cap of a micro-batch under the cost model.
        mandatory: the first ``mandatory`` groups are always placed.
        padded: padded cost (``samples x longest``) instead of summed tokens.
        max_samples: a cap on the samples of a micro-batch, or None.

    Returns:
        ``count`` lists of group positions (some possibly empty), each within both caps.

    >>> fill_bins(np.array([6, 5, 4, 3, 2]), np.ones(5, np.int64), np.array([6, 5, 4, 3, 2]), 2, 8, mandatory=2)
    [[0, 4], [1, 3]]
    """
    groups = len(cost)
    bins = _Bins(count, capacity, padded, max_samples)
    cost_list, samples_list, longest_list = cost.tolist(), samples.tolist(), longest.tolist()

    def by_size(members: range) -> list[int]:
        return sorted(members, key=lambda g: (-cost_list[g], g))

    start = min(mandatory, groups)
    window_end = min(groups, max(start + int(np.searchsorted(np.cumsum(cost), count * capacity, side="right")), start))
    packed = None
    if not padded and max_samples is None and window_end > start:
        # Fast path: one library BFD pass over the mandatory groups and the window together;
        # if it needs no more than ``count`` micro-batches, phases 1 and 2 are done.
        packed = _best_fit_decreasing(cost[:window_end], capacity)
        if len(packed) > count:
            packed = None
    if packed is not None:
        for b, members in enumerate(packed):
            bins.load[b] = int(cost[members].sum())
            bins.samples[b] = int(samples[members].sum())
            bins.longest[b] = int(longest[members].max())
            bins.members[b] = list(members)
    else:
        for g in by_size(range(start)):
            if not bins.place(g, cost_list[g], samples_list[g], longest_list[g]):
                raise RuntimeError(f"internal error: mandatory group {g} fits no micro-batch; please report")
        room = count * capacity - sum(bins.load)
        window_end = start + int(np.searchsorted(np.cumsum(cost[start:]), room, side="right"))
        window_end = min(groups, max(window_end, start + 1))
        for g in by_size(range(start, window_end)):
            bins.place(g, cost_list[g], samples_list[g], longest_list[g])
    if window_end < groups:
        tail = np.arange(window_end, groups)
        tail = tail[bins.could_fit(cost[tail], samples[tail], longest[tail])]
        if len(tail):
            # suffix minima of what any later group adds: the scan stops once even that fits nowhere
            low_cost = np.minimum.accumulate(cost[tail][::-1])[::-1].tolist()
            low_samples = np.minimum.accumulate(samples[tail][::-1])[::-1].tolist()
            low_longest = np.minimum.accumulate(longest[tail][::-1])[::-1].tolist()
            for position, g in enumerate(tail.tolist()):
                if bins.place(g, cost_list[g], samples_list[g], longest_list[g]) and position + 1 < len(tail):
                    nxt = position + 1
                    if bins.full_for(low_cost[nxt], low_samples[nxt], low_longest[nxt]):
                        break
    return [sorted(members) for members in bins.members]
