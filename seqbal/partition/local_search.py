"""Local search that never breaks the cap: the repair of over-cap parts and the rebalance.

Both move or swap single items between parts, and every step keeps every part that was within
the cap within it, so they can be run on any start and stopped at any time with a valid
result. The repair makes a balanced but over-cap start feasible (the count search's tries);
the rebalance lowers the heaviest part's workload once a count is chosen. Each searches only
a few candidate parts per step (the roomiest, or the lightest), which is what keeps a step at
O(log k) plus the part's items; the constants below say how few.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Optional, Sequence

import numpy as np

from ..validation import IntSequence, as_int_array, check_capacity, exact_total
from .bins import _Bins, _RankedBins, _sums
from .parts import ceildiv

# Tuning: how wide each step of the repair and the rebalance looks.

#: A repair's swap is looked for in the parts with the most room: this many of them (trades a
#: step's cost against the swaps it can find)...
REPAIR_SWAP_PARTS = 16
#: ... and this many once the repair is close to done (at most 1 / REPAIR_CLOSE_FRACTION of
#: its over-cap parts left). A repair that gets that far usually fails only for want of a
#: wider search (real_qwen_rollouts, 16,384 samples at cap 4096: the try at the lower bound
#: succeeds with it and fails without), while a repair far from done stays cheap to give up.
REPAIR_SWAP_PARTS_CLOSE = 256
REPAIR_CLOSE_FRACTION = 20
#: How many of the lightest parts the heaviest part is paired with, in turn, per rebalance step:
#: REBALANCE_PAIR_ITEMS / (items per part), between 8 and REBALANCE_PARTNERS. A pairing scans
#: the heavy part's items, so parts of a few items afford many partners, large parts few (trades
#: a rebalance step's cost against how often it finds an improving move).
REBALANCE_PARTNERS = 32
REBALANCE_PAIR_ITEMS = 256


def repair_over_capacity(
    parts: Sequence[Sequence[int]],
    tokens: IntSequence,
    capacity: int,
    *,
    max_steps: Optional[int] = None,
) -> Optional[list[list[int]]]:
    """Move or swap items out of over-capacity parts until every part is within ``capacity``.

    Each step takes the part with the largest excess and either moves one of its items to the
    fullest other part that still has room for it (best fit), preferring the smallest item that
    removes the whole excess, or swaps one of its items for a smaller one of a part with room.
    A step never pushes another part over the capacity and strictly lowers the total excess,
    so the search ends; it returns ``None`` if it gets stuck or runs out of steps (no part is
    ever emptied, so a non-empty input stays non-empty).

    Complexity: O(log k + |part| log |part|) per move (parts kept sorted by room), plus
    O(|part| log n) per swap search over the 16 parts with most room; at most ``max_steps``
    (default ``4 n + 16``) steps.

    >>> repair_over_capacity([[0, 1], [2]], [6, 5, 1], 10)
    [[0], [1, 2]]
    """
    size = as_int_array(tokens, "tokens")
    capacity = check_capacity(capacity)
    return _repair(parts, size, capacity, max_steps)[0]


def _repair(
    parts: Sequence[Sequence[int]], size: np.ndarray, capacity: int, max_steps: Optional[int],
    token_sums: Optional[list[int]] = None,
) -> tuple[Optional[list[list[int]]], int]:
    """:func:`repair_over_capacity` on a validated array, with the number of parts still over
    the capacity when it gives up (0 on success): how far the try was from a partition.
    ``token_sums``: the parts' token sums, where the caller has them."""
    state = _RankedBins(parts, size, capacity, token_sums)
    steps = max_steps if max_steps is not None else 4 * len(size) + 16
    over = [(capacity - load, part) for part, load in enumerate(state.tokens) if load > capacity]  # most excess first
    heapq.heapify(over)
    # Over-cap parts left; a step never pushes another part over, so only the worst one changes.
    left, close = len(over), len(over) // REPAIR_CLOSE_FRACTION
    while over:
        room, worst = heapq.heappop(over)
        if room != state.room(worst):  # stale: only the worst part's room changes by a step
            continue
        swap_parts = REPAIR_SWAP_PARTS_CLOSE if left <= close else REPAIR_SWAP_PARTS
        if steps <= 0 or state.size(worst) < 2 or not _repair_step(state, worst, -room, swap_parts):
            return None, left
        steps -= 1
        if state.room(worst) < 0:
            heapq.heappush(over, (state.room(worst), worst))
        else:
            left -= 1
    return state.result(), 0


def _repair_step(state: _RankedBins, worst: int, excess: int, swap_parts: int = REPAIR_SWAP_PARTS) -> bool:
    member_sizes, members = state.ranked(worst)
    rooms = state.by_room
    # Moves: the smallest item that clears the excess and fits somewhere, else the largest
    # positive item that fits somewhere (keeping at least one item in the part). The worst
    # part has negative room, so it is never the part with most room nor a best-fit target.
    if not rooms.blocks:
        return False  # every part is over the capacity
    max_room = rooms.last()[0]  # the worst part is over the capacity, so not in ``rooms``
    movable_end = bisect.bisect_right(member_sizes, max_room)
    if len(members) > 1 and movable_end:
        clear = bisect.bisect_left(member_sizes, excess)
        pick = clear if clear < movable_end else movable_end - 1
        if member_sizes[pick] > 0:
            # The fullest part with room for it, lowest part among equally full ones.
            fullest = rooms.first_at_least((member_sizes[pick], -math.inf))[0]
            target = -rooms.last_below((fullest + 1, -math.inf))[1]
            state.move(members[pick], worst, target)
            return True
    # Swaps with the parts that have the most room: trade an item for a smaller one.
    best: Optional[tuple[int, int, int, int]] = None  # (gain, item, other item, other part)
    bisect_left, bisect_right = bisect.bisect_left, bisect.bisect_right
    ranked_sizes, ranked_items = state._sizes, state._items  # state.ranked(other), read in line
    count = len(members)
    for room, negated in rooms.largest(swap_parts):
        other = -negated
        if room <= 0 or (best is not None and room <= best[0]):
            break  # a swap gains at most the other part's room, and rooms only get smaller
        other_sizes = ranked_sizes[other]
        if other_sizes is None:
            other_sizes, other_items = state.ranked(other)
        else:
            other_items = ranked_items[other]
        if not other_sizes:
            continue  # an empty part (only if the caller passed one): nothing to trade
        # Only members larger than the other part's smallest item can trade down.
        start = bisect_right(member_sizes, other_sizes[0])
        if start == count:
            continue
        # A gain is at most min(room, excess), and ties keep the first: once reached, nothing
        # later in this part or in the next (no more room) replaces it.
        limit = room if room < excess else excess
        others = len(other_sizes)
        for position in range(start, count):
            item_size = member_sizes[position]
            # need 0 < item_size - other_size <= room; the largest gain is the smallest
            # other item with size >= item_size - room.
            j = bisect_left(other_sizes, item_size - room)
            if j < others and other_sizes[j] < item_size:
                gain = item_size - other_sizes[j]
                if gain > excess:
                    gain = excess
                if best is None or gain > best[0]:
                    best = (gain, members[position], other_items[j], other)
                    if gain >= limit:
                        break
        if best is not None and best[0] >= limit:
            break
    if best is None:
        return False
    state.swap(best[1], worst, best[2], best[3])
    return True


def rebalance_within_capacity(
    parts: Sequence[Sequence[int]],
    tokens: IntSequence,
    workloads: IntSequence,
    capacity: int,
    *,
    max_steps: Optional[int] = None,
    close_enough: float = 0.001,
) -> list[list[int]]:
    """Lower the heaviest part's workload by moves and swaps that keep every part within the cap.

    Each step pairs the heaviest part with the lightest parts in turn and applies the single
    move (or, failing that, swap) that brings the pair's workloads closest to equal while
    strictly lowering the pair's maximum and keeping both parts within ``capacity``. It stops
    when the heaviest part cannot be improved with any of the 8 to 32 lightest parts (more when
    parts hold few items, see :data:`REBALANCE_PAIR_ITEMS`), when it is within a fraction
    ``close_enough`` (default 0.1%) of the lower bound ``max(ceil(total / k), heaviest item)``
    (no partition does better than the bound), or after ``max_steps`` steps (default
    ``2 k + 64``). Parts never become empty; a part over the cap on input is not made worse.

    Complexity: O(log k + |heavy| log |light|) per step (parts kept sorted by workload).

    >>> rebalance_within_capacity([[0, 1, 2], [3]], [1, 1, 1, 1], [5, 4, 3, 1], 10)
    [[1, 2], [0, 3]]
    """
    size = as_int_array(tokens, "tokens")
    work = as_int_array(workloads, "workloads")
    capacity = check_capacity(capacity)
    return _rebalance(parts, size, work, capacity, max_steps, close_enough)


def _rebalance(
    parts: Sequence[Sequence[int]],
    size: np.ndarray,
    work: np.ndarray,
    capacity: int,
    max_steps: Optional[int] = None,
    close_enough: float = 0.001,
) -> list[list[int]]:
    """:func:`rebalance_within_capacity` on checked arrays: the balance's own call, which
    converts and checks nothing again."""
    if not parts:
        return []
    bound = max(ceildiv(exact_total(work), len(parts)), int(work.max()) if work.size else 0)
    stop = bound * (1 + close_enough)
    part_work = _sums(work, parts)
    if max(part_work) <= stop:  # already close enough: no sorted parts to build
        return [sorted(part) for part in parts]
    state = _Bins(parts, size, work, capacity, by_work=True, work_sums=part_work)
    grows = _work_grows_with_tokens(size, work)
    steps = max_steps if max_steps is not None else 2 * len(state.members) + 64
    per_part = max(len(size) // max(len(state.members), 1), 1)
    partners = min(max(REBALANCE_PAIR_ITEMS // per_part, 8), REBALANCE_PARTNERS)
    for _ in range(steps):
        heavy_work, heavy = state.by_work.last()
        if heavy_work <= stop:
            break
        improved = False
        # The heavy part stays the same while its partners are tried: its smallest item (by
        # tokens and by workload) is found once per step, and rules out moves and swaps early.
        heavy_items = state.members[heavy]
        smallest = (min(map(state.tokens_of.__getitem__, heavy_items)), min(map(state.work_of.__getitem__, heavy_items)))
        for light_work, light in state.by_work.smallest(partners):
            if light == heavy or light_work >= heavy_work:
                break
            if _rebalance_pair(state, heavy, light, capacity, smallest, grows):
                improved = True
                break
        if not improved:
            break
    return state.result()


def _work_grows_with_tokens(tokens: np.ndarray, work: np.ndarray) -> bool:
    """Whether an item's workload is a strictly increasing function of its tokens (the default
    workload and every cost model's): then a lighter item always has fewer tokens. O(n log n)."""
    if work is tokens:
        return True
    order = np.argsort(tokens, kind="stable")
    token_steps, work_steps = np.diff(tokens[order]), np.diff(work[order])
    return bool(np.array_equal(token_steps > 0, work_steps > 0) and (work_steps >= 0).all())


def _rebalance_pair(
    state: _Bins, heavy: int, light: int, capacity: int, smallest: tuple[int, int], grows: bool = False
) -> bool:
    """The best move, else the best swap, between ``heavy`` and ``light`` (see
    :func:`rebalance_within_capacity`), applied; False if none improves the pair. ``smallest``:
    the heavy part's smallest item tokens and smallest item workload; ``grows``: workloads
    grow strictly with tokens (:func:`_work_grows_with_tokens`), which lets the swap search
    skip light items by tokens (same result, fewer candidates)."""
    work_of, tokens_of = state.work_of, state.tokens_of
    diff = state.work[heavy] - state.work[light]
    room_light = capacity - state.tokens[light]
    room_heavy = capacity - state.tokens[heavy]
    heavy_items = state.members[heavy]
    fewest_tokens, least_work = smallest
    # A move of workload w improves the pair iff 0 < w < diff; best is w closest to diff / 2.
    # No item can move when the smallest does not fit or outweighs the difference.
    if len(heavy_items) > 1 and fewest_tokens <= room_light and least_work < diff:
        best_item, best_gap = -1, diff
        for item in heavy_items:
            w = work_of[item]
            if 0 < w < diff and tokens_of[item] <= room_light:
                gap = abs(diff - 2 * w)
                if gap < best_gap:
                    best_item, best_gap = item, gap
        if best_item >= 0:
            state.move(best_item, heavy, light)
            return True
    # Swaps: delta = w_heavy_item - w_light_item must satisfy 0 < delta < diff.
    ranked = state.ranked_by_work.get(light)  # state.work_ranked(light), its lookup in line
    light_work, light_tokens, light_items = ranked if ranked is not None else state.work_ranked(light)
    if not light_items or least_work - light_work[-1] >= diff:
        # Every heavy item outweighs every light one by diff or more, so no swap improves the
        # pair: most pairings that fail end here (a heavy part of long sequences against light
        # parts of short ones), before the per-item search.
        return False
    if grows and room_light <= 0:
        return False  # a lighter item has fewer tokens, so every swap adds tokens to ``light``
    lightest, half, light_count = light_work[0], diff / 2, len(light_work)
    beyond = light_work[-1] + diff  # a heavy item this heavy outweighs every light one by diff or more
    bisect_left, bisect_right = bisect.bisect_left, bisect.bisect_right
    best_gap, best_item, best_other = -1, -1, -1  # no swap yet
    for item in heavy_items:
        w = work_of[item]
        if w <= lightest or w >= beyond:
            continue  # no lighter item to trade it for (every delta <= 0), or none within diff
        # The light items with 0 < delta < diff are the run low:high of the sorted workloads; the
        # search looks at the (up to) four around the ideal one, centre, within that run. The
        # run is empty unless its first item is lighter than w: one bisect for most items.
        low = bisect_right(light_work, w - diff)
        if low == light_count or light_work[low] >= w:
            continue
        high = bisect_left(light_work, w, low)
        if grows:
            # Light items are in token order too; those below tokens - room_light do not fit,
            # so where none of the run fits, the run is passed before its centre is looked for.
            fits = bisect_left(light_tokens, tokens_of[item] - room_light, low, high)
            if fits == high:
                continue
        centre = bisect_left(light_work, w - half, low, high)  # ideal light-item workload
        first = centre - 2 if centre - 2 > low else low
        if grows and fits > first:
            first = fits
        for j in range(first, centre + 2 if centre + 2 < high else high):
            delta = w - light_work[j]
            other = light_items[j]
            token_shift = tokens_of[item] - tokens_of[other]
            if token_shift > room_light or -token_shift > room_heavy:
                continue
            gap = abs(diff - 2 * delta)
            if best_gap < 0 or gap < best_gap:
                best_gap, best_item, best_other = gap, item, other
    if best_gap < 0:
        return False
    state.swap(best_item, heavy, best_other, light)
    return True
