"""A fresh random partition at a fixed count: items into exactly ``num_bins`` bins under a cap,
a different mix for every random generator, for the epochs of a training run.

Why not plan once and relabel: an epoch planned once and then only permuted keeps the same
*lengths* together for the whole run (and, where lengths are unique or groups are forced, the
very same samples). SGD wants a fresh mix of samples every epoch. A shuffle-then-fill (pack the
samples in random order, one bin after the other) gives that, but its count changes with the
shuffle and it wastes room at every bin's end; a trainer that reads ``len()`` once needs the
same count every epoch, and every wasted percent is a percent more forwards.

How: the items enter in a *noisy* decreasing order (each cost multiplied by a random factor in
``[1, 1 + NOISE]``), so items of similar size swap places freely while large items still come
before small ones; they are dealt in chunks of half the bins to the least-loaded bins (the
largest item of a chunk to the emptiest bin, equal loads broken by a random bin priority). That
is LPT (longest processing time first) balancing, which leaves every bin within about one small
item of the mean, so at a count near the lower bound ``ceil(total / cap)`` almost everything
fits where LPT puts it. An item that would overflow its bin is set aside, and the set-aside
items are then placed by best fit decreasing into the rooms that are left (the tight packing
LPT cannot do for items that are large next to the cap). Which items share a bin depends on
the noise and the priorities, so two generators give unrelated mixes; the count does not
change.

Every bin receives items and none exceeds the capacity (or ``max_items`` items), or the try
returns None: the caller decides what a failed try means (a larger count while searching for
one, another draw or a known plan in a later epoch).

Complexity: O(n log K) for ``n`` items and ``K`` bins, in NumPy (``2n / K`` chunk steps of
O(K log K) each), plus O(d log K) in Python for ``d`` set-aside items; memory O(n + K).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .bins import _SortedPairs
from .parts import _assignment_from_groups

__all__ = ["NOISE", "TAIL_SHARE", "TAIL_ROOMS", "SWAP_ROUNDS", "SWAP_WORK", "RANDOM_SWAP_WORK", "MAX_SWAP_ROUNDS",
           "SWAP_WIDTHS", "fresh_mix_bins", "noisy_best_fit_bins", "swap_rounds", "swap_mix", "deal_slots"]

#: Each item's sorting key is its cost times a random factor in [1, 1 + NOISE]: items within
#: this ratio of each other enter in random order. Larger mixes more and packs less tightly.
NOISE = 0.3
#: The smallest items kept out of the deal for best fit: at least this share of the total cost...
TAIL_SHARE = 0.05
#: ... and at least this many times the room the bins will have left in all.
TAIL_ROOMS = 4
#: Rounds of random swaps :func:`swap_mix` makes at least (each one sort of the items)...
SWAP_ROUNDS = 24
#: ... and on small inputs up to this many item-rounds in all (a few items need many rounds to
#: spread: each swap moves an item to a neighbour of similar cost), at most MAX_SWAP_ROUNDS.
SWAP_WORK = 3_000_000
#: The item-rounds of swaps after a partition that is random already (a deal): never more.
RANDOM_SWAP_WORK = 1_000_000
MAX_SWAP_ROUNDS = 400
#: A round pairs items whose costs differ by up to this many times the mean room a bin has left,
#: in turn.
SWAP_WIDTHS = (1.0, 4.0)


def fresh_mix_bins(
    costs: np.ndarray,
    num_bins: int,
    capacity: int,
    rng: np.random.Generator,
    *,
    max_items: Optional[int] = None,
) -> Optional[np.ndarray]:
    """One random partition of the items into exactly ``num_bins`` non-empty bins under the cap.

    Args:
        costs: each item's cost (int64, each ``<= capacity``, additive: a bin costs their sum).
        num_bins: the number of bins, at most the number of items.
        capacity: the cap on a bin's summed cost.
        rng: the random stream; the same stream gives the same partition on every machine.
        max_items: at most this many items per bin (None: no limit).

    Returns:
        the bin of every item (int64, in ``[0, num_bins)``), or None if this draw did not place
        every item within the caps.

    Complexity: O(n log K) (see the module docstring).

    >>> bins = fresh_mix_bins(np.array([5, 4, 3, 3, 2, 2, 1]), 2, 10, np.random.default_rng(0))
    >>> sorted(np.bincount(bins, weights=[5, 4, 3, 3, 2, 2, 1]).tolist())
    [10.0, 10.0]
    """
    n = len(costs)
    if num_bins < 1 or num_bins > n:
        return None
    item_limit = n if max_items is None else int(max_items)
    if item_limit * num_bins < n:
        return None
    keys = costs * (1.0 + NOISE * rng.random(n))
    order = np.lexsort((np.arange(n), -keys))  # noisy decreasing, index on (impossible) ties
    bins_by_priority = np.argsort(rng.permutation(num_bins))  # which bin wins among equal loads
    # First the balanced deal: every item dealt, best fit only for what overflows. Where that
    # leaves rooms too small for what is left (a count near the bound), the tight deal keeps the
    # smallest items out of the deal for best fit: LPT leaves every bin about the same room, and
    # small items packed best-fit fill those rooms tightly (at the price of a few lighter bins).
    total = int(costs.sum())
    free = num_bins * capacity - total
    from_end = np.cumsum(costs[order[::-1]])
    tail = int(np.searchsorted(from_end, max(TAIL_SHARE * total, TAIL_ROOMS * free), side="left"))
    for dealt in (n, max(n - tail, min(n, num_bins))):  # every bin gets an item from the deal
        assigned = _deal(costs, order, dealt, bins_by_priority, capacity, item_limit)
        if assigned is not None:
            return assigned
        if dealt < n:
            break
    return None


def _deal(
    costs: np.ndarray,
    order: np.ndarray,
    dealt: int,
    bins_by_priority: np.ndarray,
    capacity: int,
    item_limit: int,
) -> Optional[np.ndarray]:
    """LPT-deal the first ``dealt`` items of ``order`` in chunks of half the bins, then best-fit
    what overflowed and the rest of ``order``. The bin of every item, or None."""
    n, num_bins = len(costs), len(bins_by_priority)
    loads = np.zeros(num_bins, dtype=np.int64)
    counts = np.zeros(num_bins, dtype=np.int64)
    assigned = np.full(n, -1, dtype=np.int64)
    set_aside: list[np.ndarray] = []
    chunk = max(1, num_bins // 2)
    for start in range(0, dealt, chunk):
        items = order[start:min(start + chunk, dealt)]
        items = items[np.argsort(-costs[items], kind="stable")]  # largest of the chunk first
        # Bins by load ascending, equal loads in priority order; full bins (by count) dropped.
        candidates = bins_by_priority[np.argsort(loads[bins_by_priority], kind="stable")]
        if item_limit < n:
            candidates = candidates[counts[candidates] < item_limit]
        take = min(len(items), len(candidates))
        targets = candidates[:take]
        fits = loads[targets] + costs[items[:take]] <= capacity
        placed, placed_bins = items[:take][fits], targets[fits]
        assigned[placed] = placed_bins
        loads[placed_bins] += costs[placed]  # targets are distinct bins
        counts[placed_bins] += 1
        set_aside.append(items[:take][~fits])
        set_aside.append(items[take:])
    set_aside.append(order[dealt:])
    leftover = np.concatenate(set_aside)
    if len(leftover) and not _best_fit_into(costs, leftover, loads, counts, assigned, capacity, item_limit):
        return None
    if np.any(counts == 0):
        return None
    return assigned


def _best_fit_into(
    costs: np.ndarray,
    items: np.ndarray,
    loads: np.ndarray,
    counts: np.ndarray,
    assigned: np.ndarray,
    capacity: int,
    item_limit: int,
) -> bool:
    """Place ``items`` (largest first) each into the bin with the least room that still fits
    it and has fewer than ``item_limit`` items; update the arrays in place. False as soon as one
    fits nowhere (or at once, when their total exceeds the room left). O(d log K) with the
    blocked sorted list of ``(room, bin)`` pairs the local search uses."""
    num_bins = len(loads)
    open_bins = np.flatnonzero(counts < item_limit)
    rooms = capacity - loads[open_bins]
    if int(costs[items].sum()) > int(rooms.sum()):
        return False
    index = _SortedPairs(zip(rooms.tolist(), open_bins.tolist()))  # (room, bin): least room first
    for item in items[np.argsort(-costs[items], kind="stable")].tolist():
        size = int(costs[item])
        pair = index.first_at_least((size, -1))
        if pair is None:
            return False
        index.remove(pair)
        room, target = pair
        assigned[item] = target
        loads[target] += size
        counts[target] += 1
        if counts[target] < item_limit:
            index.add((room - size, target))
    return True


def noisy_best_fit_bins(
    costs: np.ndarray,
    num_bins: int,
    capacity: int,
    rng: np.random.Generator,
    *,
    noise: float = 0.1,
    max_items: Optional[int] = None,
) -> Optional[np.ndarray]:
    """Best fit in a noisy decreasing order (each cost times a random factor in ``[1, 1 + noise]``),
    opening bins as needed, then split up to exactly ``num_bins``: a random partition for inputs
    too tight for :func:`fresh_mix_bins` (items large next to the cap, no room to spare). Its
    bins hold items of similar sizes, but which ones changes with ``rng``.

    Returns:
        the bin of every item, or None if the packing needs more than ``num_bins`` bins.

    Complexity: O(n log n) in Python (one best-fit pass) plus the split.

    >>> noisy_best_fit_bins(np.array([6, 4, 5, 5]), 2, 10, np.random.default_rng(0)).tolist()
    [0, 0, 1, 1]
    """
    from .packing import split_bins_to_count

    n = len(costs)
    if num_bins < 1 or num_bins > n:
        return None
    item_limit = n if max_items is None else int(max_items)
    keys = costs * (1.0 + noise * rng.random(n))
    order = np.lexsort((np.arange(n), -keys))
    index = _SortedPairs([])  # room * num_bins + bin of the open bins (ints compare faster than pairs)
    members: list[list[int]] = []
    for item, size in zip(order.tolist(), costs[order].tolist()):
        key = index.first_at_least(size * num_bins)
        if key is None:
            if len(members) == num_bins:
                return None
            room, target = capacity, len(members)
            members.append([])
        else:
            index.remove(key)
            room, target = divmod(key, num_bins)
        members[target].append(item)
        if len(members[target]) < item_limit:
            index.add((room - size) * num_bins + target)
    if len(members) < num_bins:
        members = split_bins_to_count(members, costs, num_bins)
    return _assignment_from_groups(members, n)


def swap_rounds(n: int, within_work: bool = False) -> int:
    """The rounds :func:`swap_mix` makes by default on ``n`` items: :data:`SWAP_ROUNDS`, more on
    small inputs (up to :data:`SWAP_WORK` item-rounds, at most :data:`MAX_SWAP_ROUNDS`);
    ``within_work``: never more than :data:`RANDOM_SWAP_WORK` item-rounds (none past that many
    items), for partitions that are random already and only need their structure broken. O(1).

    >>> swap_rounds(2000), swap_rounds(10**4), swap_rounds(10**6), swap_rounds(10**6, within_work=True)
    (400, 300, 24, 1)
    """
    rounds = max(SWAP_ROUNDS, min(MAX_SWAP_ROUNDS, SWAP_WORK // max(n, 1)))
    return min(rounds, RANDOM_SWAP_WORK // max(n, 1)) if within_work else rounds


def swap_mix(
    bins: np.ndarray,
    costs: np.ndarray,
    capacity: int,
    rng: np.random.Generator,
    *,
    rounds: Optional[int] = None,
    band: Optional[int] = None,
) -> np.ndarray:
    """A partition re-mixed by random swaps of items of similar cost between bins, each bin
    kept within the cap: a fresh mix at the same count for inputs too tight for a random draw.

    With ``band``, every bin's cost also stays within ``band`` of its cost on entry, and items
    pair with those within about ``band`` of their own cost: the members change, the loads
    barely move, so a partition whose bins were balanced stays balanced.

    Every round sorts the items by cost plus a random amount (up to a few times the mean room a
    bin has left), pairs neighbours in that order and swaps every pair whose two bins stay
    within the cap whatever else the round swaps (a bin's rises in the round, summed, fit its
    room). Swaps keep every bin's item count, so a cap on items per bin holds too, and no bin
    empties. Items of equal cost always swap, so a tight packing with no room at all still
    trades those; where rooms exist, the room moves with the swaps and the mix spreads.

    Args:
        bins: the bin of every item (int64), a partition within ``capacity``.
        costs: each item's additive cost (int64).
        capacity: the cap on a bin's summed cost.
        rng: the random stream; the same stream gives the same result on every machine.
        rounds: rounds of swaps; default :data:`SWAP_ROUNDS`, more on small inputs
            (:data:`SWAP_WORK`, :data:`MAX_SWAP_ROUNDS`).
        band: the most a bin's cost may move from its cost on entry (None: up to the cap).

    Returns:
        a new bin array: the same bins, the same item count in each, each within ``capacity``
        (and within ``band`` of its cost on entry).

    Complexity: O(rounds * n log n) in NumPy (by default at most
    ``max(SWAP_ROUNDS * n, SWAP_WORK)`` item-rounds); memory O(n + K).

    >>> bins = swap_mix(np.array([0, 0, 1, 1]), np.array([3, 5, 3, 5]), 8, np.random.default_rng(1))
    >>> sorted(np.bincount(bins, weights=[3, 5, 3, 5]).tolist()), np.bincount(bins).tolist()
    ([8.0, 8.0], [2, 2])
    """
    bins = np.array(bins, dtype=np.int64)
    costs = np.asarray(costs, dtype=np.int64)
    n = len(costs)
    if n < 2:
        return bins
    if rounds is None:
        rounds = swap_rounds(n)
    num_bins = int(bins.max()) + 1
    loads = np.bincount(bins, weights=costs, minlength=num_bins).astype(np.int64)
    mean_room = max(1.0, float(num_bins * capacity - int(loads.sum())) / num_bins)
    if band is not None:
        band = int(band)
        if band < 0:
            raise ValueError(f"swap_mix: band must be >= 0, got {band}")
        ceiling = np.minimum(capacity, loads + band)
        floor = loads - band
    else:
        ceiling, floor = np.full(num_bins, capacity, dtype=np.int64), None
    for r in range(rounds):
        width = mean_room * SWAP_WIDTHS[r % len(SWAP_WIDTHS)] if band is None else max(band, 1)
        order = np.argsort(costs + width * rng.random(n), kind="stable")
        shift = int(rng.integers(2))
        pairs = (n - shift) // 2
        a, b = order[shift:shift + 2 * pairs:2], order[shift + 1:shift + 2 * pairs:2]
        bin_a, bin_b = bins[a], bins[b]
        rise = costs[b] - costs[a]  # bin_a rises by this, bin_b falls by it
        valid = bin_a != bin_b
        up = np.bincount(bin_a, weights=np.where(valid & (rise > 0), rise, 0), minlength=num_bins)
        up += np.bincount(bin_b, weights=np.where(valid & (rise < 0), -rise, 0), minlength=num_bins)
        fits = up <= ceiling - loads
        if floor is not None:  # a bin's falls in the round, summed, keep it above its floor
            down = np.bincount(bin_a, weights=np.where(valid & (rise < 0), -rise, 0), minlength=num_bins)
            down += np.bincount(bin_b, weights=np.where(valid & (rise > 0), rise, 0), minlength=num_bins)
            fits &= down <= loads - floor
        ok = valid & fits[bin_a] & fits[bin_b]
        a, b, bin_a, bin_b, rise = a[ok], b[ok], bin_a[ok], bin_b[ok], rise[ok]
        bins[a], bins[b] = bin_b, bin_a
        loads += np.bincount(bin_a, weights=rise, minlength=num_bins).astype(np.int64)
        loads -= np.bincount(bin_b, weights=rise, minlength=num_bins).astype(np.int64)
    return bins


def deal_slots(bin_workloads: np.ndarray, num_replicas: int, rng: Optional[np.random.Generator]) -> np.ndarray:
    """Arrange ``K = num_replicas * M`` bins as ``[rank][slot]``: slot ``i`` holds ``num_replicas``
    bins of similar workload, one per rank.

    Bins sorted by workload (heaviest first) are cut into consecutive runs of ``num_replicas``:
    neighbours in that order differ least, so every slot's bins are near-equal and a rank waits
    little for the others at each micro-batch. With ``rng``, the slots come in random order and
    each slot's bins go to the ranks in random order (ties in workload broken by ``rng`` too);
    without it, heaviest slot first and bins in workload order.

    Returns:
        an int64 array of shape ``(num_replicas, M)`` of bin ids.

    Complexity: O(K log K).

    >>> deal_slots(np.array([5, 1, 4, 2]), 2, None).tolist()
    [[0, 3], [2, 1]]
    """
    num_bins = len(bin_workloads)
    slots = num_bins // num_replicas
    tie = rng.permutation(num_bins) if rng is not None else np.arange(num_bins)
    by_work = np.lexsort((tie, -np.asarray(bin_workloads, dtype=np.float64)))
    grid = by_work.reshape(slots, num_replicas)
    if rng is not None:
        grid = grid[rng.permutation(slots)]
        grid = np.take_along_axis(grid, rng.permuted(np.tile(np.arange(num_replicas), (slots, 1)), axis=1), axis=1)
    return grid.T.copy()
