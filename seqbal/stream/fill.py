"""Fill a fixed number of capped micro-batches from a pool of groups: as many pending tokens as
fit, the oldest first where that costs (almost) nothing.

A trainer with a fixed count (``K`` micro-batches on each of ``R`` ranks) wants every step as
full as the cap allows, and no sample left behind for ever. Exact maximum filling is a
multiple-knapsack problem; this is a greedy, each placement a best fit (a group goes to the
fullest micro-batch it still fits in, so large holes stay open for large groups). The
``mandatory`` oldest groups (each fits alone, at most one per micro-batch) are always placed
first: this is what bounds every group's wait (:class:`seqbal.StepPlanner`'s
``max_wait_steps``); a ``quota`` asks instead for any ``needed`` of the first ``prefix``
groups (a deadline that any of them meets). Then several fills are built and one is kept:

* **oldest first**: the next oldest groups, as many as the room left could hold, best-fit
  decreasing (with the token cost and no sample cap, one library pass over the mandatory groups
  and this window, when that fits ``count`` micro-batches), then younger groups into the gaps in
  arrival order;
* **fullest**: every other pending group in decreasing size (older first among equals), each
  where it fits best, skipping those that fit nowhere: first-fit-decreasing quality over the
  whole pool;
* with mandatory groups or a quota (token cost, no sample cap): **reserving**, every group in
  decreasing size with the mandatory ones in their places, a group placed only where those
  still to come keep room; and **exchanged**, the fullest fill with no group mandatory, each
  mandatory group it left out swapped in for the placed group whose loss is least.

Oldest first is kept when it places at least :data:`OLDEST_FIRST_SHARE` of the best other
fill's cost, else the fullest of the others (with a quota, only fills that meet it count). Why
not one: oldest first alone blocks better fits when few large groups wait (the oldest, one per
micro-batch, leave holes nothing younger fits in arrival order); fullest alone would let old
mid-sized groups wait behind every large arrival; a mandatory group placed first can cost more
than one placed in its turn. Where oldest first takes everything, or no fill could beat it by
1%, it is kept without building the others. ``oldest_only`` asks for arrival order alone: the
``count`` oldest groups mandatory and the oldest-first fill, never another (a caller whose pool
must drain in order, at the cost of a step less full than the fullest fill).

Cost: O(p log p) NumPy work on a pool of ``p`` groups (the sort), plus O(c * count) for the
``c`` groups placed or visited: groups that cannot fit any micro-batch's room are skipped by a
binary search (token cost) or one vectorised comparison (other costs), not visited.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..partition.packing import _best_fit_decreasing

#: The oldest-first fill is kept when it places at least this share of the best other fill's cost.
OLDEST_FIRST_SHARE = 0.99


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

    def put(self, target: int, group: int, cost: int, samples: int, longest: int) -> None:
        """Add a group to micro-batch ``target`` (the caller knows it fits)."""
        self.samples[target] += samples
        self.longest[target] = max(self.longest[target], longest)
        self.load[target] = (self.samples[target] * self.longest[target] if self.padded
                             else self.load[target] + cost)
        self.members[target].append(group)

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
    quota: Optional[tuple[int, int]] = None,
    oldest_only: bool = False,
) -> Optional[list[list[int]]]:
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
        quota: ``(prefix, needed)``: at least ``needed`` (<= ``count``) of the first ``prefix``
            groups must be placed, any of them; None: no such demand.
        oldest_only: the groups in arrival order and nothing else: the ``count`` oldest are
            mandatory (``mandatory`` is raised to ``min(count, len(cost))``) and the oldest-first
            fill is returned alone, never a fuller one that takes younger groups before older
            ones (``quota`` is then met already: it asks for at most ``count`` groups). Default
            False.

    Returns:
        ``count`` lists of group positions (some possibly empty), each within both caps; every
        group left out fits in no micro-batch's room. None only with a ``quota`` no candidate
        met (a cost model other than plain tokens: the caller then makes those groups
        mandatory).

    >>> fill_bins(np.array([6, 5, 4, 3, 2]), np.ones(5, np.int64), np.array([6, 5, 4, 3, 2]), 2, 8, mandatory=2)
    [[0, 4], [1, 3]]
    >>> fill_bins(np.array([3, 3, 7, 7]), np.ones(4, np.int64), np.array([3, 3, 7, 7]), 2, 10, mandatory=0)
    [[0, 2], [1, 3]]
    >>> fill_bins(np.array([4, 1, 7, 7]), np.ones(4, np.int64), np.array([4, 1, 7, 7]), 2, 10, mandatory=0)
    [[1, 2], [3]]
    >>> fill_bins(np.array([4, 1, 7, 7]), np.ones(4, np.int64), np.array([4, 1, 7, 7]), 2, 10, mandatory=0,
    ...           oldest_only=True)  # the 2 oldest first, group 3 waits
    [[0, 1], [2]]
    """
    if oldest_only:
        mandatory = max(mandatory, min(count, len(cost)))
    oldest = _oldest_first(cost, samples, longest, count, capacity, mandatory, padded, max_samples)
    if mandatory >= len(cost) or oldest_only:
        return [sorted(members) for members in oldest.members]
    kept, best = oldest, _placed_cost(oldest, cost)
    threshold = best / OLDEST_FIRST_SHARE
    if quota is None and (best == int(cost.sum()) or threshold >= count * capacity):
        return [sorted(members) for members in oldest.members]  # everything, or no fill could beat it
    candidates = [_fullest(cost, samples, longest, count, capacity, mandatory, padded, max_samples)]
    if (mandatory or quota is not None) and not padded and max_samples is None:
        candidates.append(_reserving(cost, samples, longest, count, capacity, mandatory, quota or (mandatory, 0)))
        if mandatory and quota is None:
            exchanged = _exchanged(cost, count, capacity, mandatory)
            if exchanged is not None:
                candidates.append(exchanged)
    if quota is not None:
        prefix, needed = quota
        if sum(g < prefix for members in oldest.members for g in members) < needed:
            kept, best, threshold = None, -1, -1
        candidates = [c for c in candidates if sum(g < prefix for members in c.members for g in members) >= needed]
    for fullest in candidates:
        value = _placed_cost(fullest, cost)
        if value > threshold and value > best:
            kept, best = fullest, value
    if kept is None:
        return None
    return [sorted(members) for members in kept.members]


def _placed_cost(bins: _Bins, cost: np.ndarray) -> int:
    placed = [g for members in bins.members for g in members]
    return int(cost[placed].sum()) if placed else 0


def _place_mandatory(bins: _Bins, cost_list: list, samples_list: list, longest_list: list, mandatory: int) -> None:
    g = _place_decreasing(bins, range(mandatory), cost_list, samples_list, longest_list)
    if g is not None:
        raise RuntimeError(f"internal error: mandatory group {g} fits no micro-batch; please report")


def _place_decreasing(bins: _Bins, groups, cost_list: list, samples_list: list, longest_list: list) -> Optional[int]:
    """Place every one of ``groups`` by best fit in decreasing cost (older first among equals);
    the first that fits nowhere (the others after it unplaced), or None."""
    for g in sorted(groups, key=lambda g: (-cost_list[g], g)):
        if not bins.place(g, cost_list[g], samples_list[g], longest_list[g]):
            return g
    return None


def _fullest(cost: np.ndarray, samples: np.ndarray, longest: np.ndarray, count: int, capacity: int,
             mandatory: int, padded: bool, max_samples: Optional[int]) -> _Bins:
    """The mandatory groups, then every other group in decreasing cost (older first among
    equals), each by best fit, those that fit nowhere skipped."""
    bins = _Bins(count, capacity, padded, max_samples)
    _place_mandatory(bins, cost.tolist(), samples.tolist(), longest.tolist(), mandatory)
    return _fill_decreasing(bins, cost, samples, longest, np.arange(mandatory, len(cost)))


def top_up_bins(cost: np.ndarray, samples: np.ndarray, longest: np.ndarray, count: int, capacity: int, *,
                seeded: Optional[list[list[int]]] = None, must: Sequence[int] = (), padded: bool = False,
                max_samples: Optional[int] = None) -> Optional[list[list[int]]]:
    """``count`` micro-batches that hold ``seeded`` as given (a list of group positions per
    micro-batch, each within both caps), then the groups ``must`` (best fit, in decreasing
    cost), then as many of the other groups as fit (the fullest fill's pass: decreasing cost,
    older first among equals, best fit, those that fit nowhere skipped). None if a group of
    ``must`` fits nowhere. O(p log p) plus O(c * count) for the ``c`` groups visited.

    >>> top_up_bins(np.array([6, 2, 3, 4]), np.ones(4, np.int64), np.array([6, 2, 3, 4]), 2, 8, seeded=[[1], [2]])
    [[0, 1], [2, 3]]
    >>> top_up_bins(np.array([6, 5, 3, 3]), np.ones(4, np.int64), np.array([6, 5, 3, 3]), 2, 8, must=[2, 3])
    [[2, 3], [0]]
    """
    bins = _Bins(count, capacity, padded, max_samples)
    used = set()
    for target, members in enumerate(seeded or []):
        for g in members:
            bins.put(target, g, int(cost[g]), int(samples[g]), int(longest[g]))
            used.add(g)
    must = [g for g in must if g not in used]
    if _place_decreasing(bins, must, cost.tolist(), samples.tolist(), longest.tolist()) is not None:
        return None
    used.update(must)
    rest = np.array([g for g in range(len(cost)) if g not in used], dtype=np.int64)
    _fill_decreasing(bins, cost, samples, longest, rest)
    return [sorted(members) for members in bins.members]


def _fill_decreasing(bins: _Bins, cost: np.ndarray, samples: np.ndarray, longest: np.ndarray,
                     rest: np.ndarray) -> _Bins:
    """The groups ``rest`` in decreasing cost (older first among equals) into ``bins``, each by
    best fit, those that fit nowhere skipped."""
    capacity, padded = bins.capacity, bins.padded
    cost_list, samples_list, longest_list = cost.tolist(), samples.tolist(), longest.tolist()
    order = rest[np.lexsort((rest, -cost[rest]))] if len(rest) else rest
    if not padded and bins.unlimited:
        # costs descending: the first group that fits the roomiest micro-batch is a binary search
        ascending = -cost[order]
        position = 0
        while position < len(order):
            room = capacity - min(bins.load)
            position = max(position, int(np.searchsorted(ascending, -room, side="left")))
            if position >= len(order):
                break
            g = int(order[position])
            bins.place(g, cost_list[g], samples_list[g], longest_list[g])
            position += 1
        return bins
    order = order[bins.could_fit(cost[order], samples[order], longest[order])]
    if len(order):
        low_cost = np.minimum.accumulate(cost[order][::-1])[::-1].tolist()
        low_samples = np.minimum.accumulate(samples[order][::-1])[::-1].tolist()
        low_longest = np.minimum.accumulate(longest[order][::-1])[::-1].tolist()
        for position, g in enumerate(order.tolist()):
            if bins.place(g, cost_list[g], samples_list[g], longest_list[g]) and position + 1 < len(order):
                nxt = position + 1
                if bins.full_for(low_cost[nxt], low_samples[nxt], low_longest[nxt]):
                    break
    return bins


def _reserving(cost: np.ndarray, samples: np.ndarray, longest: np.ndarray, count: int, capacity: int,
               mandatory: int, quota: tuple[int, int]) -> _Bins:
    """Token cost, no sample cap: every group in decreasing cost (older first among equals),
    each by best fit, the mandatory ones in their places, and at least ``quota[1]`` of the
    first ``quota[0]`` groups. A group is placed only where what must still come keeps room:
    the mandatory groups still to come and the smallest prefix groups still needed, largest
    first, each fit the rooms left largest first (the ``i``-th largest need, the ``i``-th
    largest room), so each of those fits when its turn comes."""
    bins = _Bins(count, capacity, False, None)
    cost_list = cost.tolist()
    everyone = np.arange(len(cost))
    order = everyone[np.lexsort((everyone, -cost))].tolist()
    prefix, needed = quota
    strict = sorted((cost_list[g] for g in range(mandatory)), reverse=True)  # mandatory costs to come
    optional = sorted(cost_list[g] for g in range(mandatory, prefix))  # other prefix costs to come, ascending
    in_prefix = 0
    smallest = np.minimum.accumulate(cost[order][::-1])[::-1].tolist()  # least cost from here on

    def keeps_room(target: int, after: int, counted: int) -> bool:
        extra = max(0, needed - counted - len(strict))
        needs = sorted(strict + optional[:extra], reverse=True)
        if not needs:
            return True
        if len(needs) > count:
            return False
        rooms = sorted((capacity - (after if b == target else load) for b, load in enumerate(bins.load)), reverse=True)
        return all(need <= room for need, room in zip(needs, rooms))

    ascending = -cost[np.asarray(order, dtype=np.int64)]  # for the binary search below
    is_prefix = np.asarray(order, dtype=np.int64) < prefix
    position = 0
    while position < len(order):
        # what does not fit the roomiest micro-batch now never will: jump past it (a reserved
        # group always fits, so none is jumped over)
        jump = max(position, int(np.searchsorted(ascending, -(capacity - min(bins.load)), side="left")))
        for _ in range(int(np.count_nonzero(is_prefix[position:jump]))):
            optional.pop()  # prefix groups jumped over, the largest of those to come
        position = jump
        if position >= len(order):
            break
        g = order[position]
        size = cost_list[g]
        forced = g < mandatory
        if forced:
            strict.remove(size)
        elif g < prefix:
            forced = len(optional) <= max(0, needed - in_prefix - len(strict))  # every one left is needed
            optional.pop()  # the largest prefix cost to come is this one
        elif not strict and in_prefix >= needed and min(bins.load) + smallest[position] > capacity:
            break  # nothing left fits anywhere and nothing more is needed
        position += 1
        if forced:
            if not bins.place(g, size, 1, size):
                raise RuntimeError(f"internal error: reserved group {g} fits no micro-batch; please report")
            in_prefix += g < prefix
            continue
        target, after = bins._best(size, 1, size)
        if target < 0 or not keeps_room(target, after, in_prefix + (g < prefix)):
            continue
        bins.place(g, size, 1, size)
        in_prefix += g < prefix
    return bins


def _exchanged(cost: np.ndarray, count: int, capacity: int, mandatory: int) -> Optional[_Bins]:
    """Token cost, no sample cap: the fill of every group in decreasing cost with no group
    mandatory, then each mandatory group it left out (largest first) put in by exchange: into
    the micro-batch where it replaces the placed group that loses the fewest tokens (the
    replaced group then goes wherever it still fits). None if one cannot get in."""
    zeros = np.ones(len(cost), dtype=np.int64)
    bins = _fullest(cost, zeros, cost, count, capacity, 0, False, None)
    cost_list = cost.tolist()
    placed = {g for members in bins.members for g in members}
    for g in sorted((g for g in range(mandatory) if g not in placed), key=lambda g: (-cost_list[g], g)):
        if bins.place(g, cost_list[g], 1, cost_list[g]):
            continue
        best: Optional[tuple[int, int, int]] = None  # (tokens lost, micro-batch, group replaced)
        for b, members in enumerate(bins.members):
            for x in members:
                if x >= mandatory and bins.load[b] - cost_list[x] + cost_list[g] <= capacity:
                    loss = cost_list[x] - cost_list[g]
                    if best is None or (loss, b, x) < best:
                        best = (loss, b, x)
        if best is None:
            return None
        _, b, x = best
        bins.members[b].remove(x)
        bins.load[b] += cost_list[g] - cost_list[x]
        bins.members[b].append(g)
        bins.place(x, cost_list[x], 1, cost_list[x])  # where it still fits, if anywhere
    return bins


def _oldest_first(cost: np.ndarray, samples: np.ndarray, longest: np.ndarray, count: int, capacity: int,
                  mandatory: int, padded: bool, max_samples: Optional[int]) -> _Bins:
    """The mandatory groups, a window of the next oldest best-fit decreasing, then younger
    groups into the gaps in arrival order."""
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
        # if it needs no more than ``count`` micro-batches, they are all placed.
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
        _place_mandatory(bins, cost_list, samples_list, longest_list, start)
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
    return bins
