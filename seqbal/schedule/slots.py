"""Aligned slots: slot ``i`` of every rank carries similar work (steps 4-6 of the schedule).

The bins are handed out as **aligned slots**, not only as balanced ranks. Under FSDP every
micro-batch gathers and scatters parameters, so ranks wait for each other at every micro-batch
and a step costs the sum over slots of the slowest rank's micro-batch in that slot; balancing
whole ranks (all that DDP's once-per-step all-reduce needs) leaves slot ``i`` holding unrelated
micro-batches on different ranks. So the bins are sorted by workload and cut into slots of
``dp_size``, each slot is evened out with group moves and swaps under the cap
(:func:`_even_slots`), each slot's bins are placed on ranks so that rank totals balance as well
(:func:`_ranks_within_slots`, then :func:`_polish_ranks`), and the slots run in the same order
on every rank (the pipeline order of ``use_dynamic_bsz_balance``). The alternative, ordering
each rank's micro-batches after a rank-level assignment, cannot move work between ranks any
more. Every step is bounded by the budgets below, whatever the data.

The evening is most of the schedule's planning time on large batches (thousands of trade steps
at 32,768 samples on 32 ranks), and each step is a few small array operations, so it is built
to call NumPy as few times as it can for the same trades: every bin's candidate groups sit in
one padded row of a matrix (a step gathers its partners' rows at once, and only the two bins a
trade changes are written again), and a slot's roomiest partners in other slots are chosen
again only when a trade reached another slot. Each of these keeps the trades of the plain
version step for step (tests/test_slots.py pins them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Optional, Sequence

import numpy as np

from ..partition.parts import _part_sums


#: A slot counts as even once its heaviest micro-batch is within this factor of the slot's mean:
#: past it a step gains less than a thousandth of a percent of the step time.
SLOT_CLOSE_ENOUGH = 1.00001
#: ... or once that excess (heaviest minus mean) is at most this fraction of the step, the sum
#: of every slot's heaviest micro-batch; 0 turns it off, as shipped. Relative to the step, not
#: the slot: a slot left there costs the step at most this fraction over its even split.
#: ``benchmarks.schedule_tradeoff`` measures what it would save and cost (docs/benchmarks_method.md, the schedule's 12-pass target).
SLOT_MIN_EXCESS = 0.0
#: Micro-batches of other slots a slot's heaviest one may trade with in one step, the ones with
#: the most room below their own slot's maximum: past the few roomiest a trade rarely fits. On
#: more than ``SLOT_PARTNERS + 1`` ranks, also the most of its own slot's (the lightest).
SLOT_PARTNERS = 16
#: Passes over all slots; a pass that changes nothing ends the evening early.
SLOT_PASSES = 3


#: Groups of one bin a trade looks at, at most: beyond it, evenly spaced ranks of the bin's
#: groups by workload (a bin of thousands of short samples would make a step quadratic in them).
TRADE_ITEMS = 24
#: Heavy groups (the lightest of those a trade looks at) scored first for swaps: most steps find
#: their best swap among them, and skip the rest.
SWAP_FIRST_ROWS = 4
#: Trades per slot per pass, at most.
SLOT_STEPS = 64
#: Trade attempts over all slots and passes, per slot (plus 64): bounds the evening at
#: O(slots) vectorised steps whatever the data.
SLOT_BUDGET_PER_SLOT = 64


#: The workload of a padding lane of the picked groups: above any group's (a sum of int64 workloads).
PADDING = np.int64(1) << 62


def _some(items: list[int], work: np.ndarray) -> np.ndarray:
    """``items`` (as an int64 array, in their order), or :data:`TRADE_ITEMS` of them at evenly
    spaced workload ranks. O(s log s)."""
    array = np.asarray(items, dtype=np.int64)
    if len(array) <= TRADE_ITEMS:
        return array
    ranked = array.take(np.argsort(work.take(array), kind="stable"))
    # strictly increasing positions (the step (s - 1) / (TRADE_ITEMS - 1) is at least 1 here)
    return ranked[(np.arange(TRADE_ITEMS) * (len(array) - 1)) // (TRADE_ITEMS - 1)]


@dataclass
class _Bins:
    """The micro-batches that group trades reshape, and the rules every trade keeps.

    Shared by the slot evening and the rank polish, which trade the same way: one group moved
    between two bins, or two swapped, never past ``capacity`` tokens, never emptying a bin.
    ``parts`` are copies of the caller's lists, changed in place; ``bin_tokens`` and
    ``bin_work`` (exact int64 sums per bin) follow every :meth:`exchange`.
    """

    #: group indices per bin
    parts: list[list[int]]
    #: tokens per group (under the cost model)
    tokens: np.ndarray
    #: workload per group
    work: np.ndarray
    #: tokens per bin, at most
    capacity: int
    #: whether a single group may move; False: swaps only, so every bin keeps its group count
    #: (``equal_samples``)
    moves: bool
    bin_tokens: np.ndarray = field(init=False)
    bin_work: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.parts = [list(p) for p in self.parts]
        self.bin_tokens = _part_sums(self.tokens, self.parts).astype(np.int64)
        self.bin_work = _part_sums(self.work, self.parts).astype(np.int64)

    def exchange(self, group: int, source: int, target: int) -> None:
        """Move ``group`` from bin ``source`` to the end of bin ``target``. O(size of ``source``)."""
        self.parts[source].remove(group)
        self.parts[target].append(group)
        self.bin_tokens[source] -= self.tokens[group]
        self.bin_tokens[target] += self.tokens[group]
        self.bin_work[source] -= self.work[group]
        self.bin_work[target] += self.work[group]

    def sort(self) -> None:
        """Each bin's groups in ascending order (what the next stage and the schedule start from)."""
        self.parts = [sorted(p) for p in self.parts]


def _slots_from_bins(parts: list[list[int]], bin_work: Sequence[int], dp: int) -> list[list[int]]:
    """Bins sorted by workload (heaviest first, ties by first group), cut into slots of ``dp``.

    Grouping consecutive bins of the sorted order minimises the sum over slots of the heaviest
    bin in the slot (an exchange argument), which is the step time when ranks sync at every
    micro-batch. O(t log t).
    """
    order = sorted(range(len(parts)), key=lambda b: (-int(bin_work[b]), parts[b][0] if parts[b] else -1))
    return [order[start:start + dp] for start in range(0, len(order), dp)]


def _even_slots(bins: _Bins, slots: list[list[int]], budget: Optional[int] = None) -> None:
    """Lower the sum over slots of each slot's heaviest bin: single-group moves and swaps between
    a slot's heaviest bin and another bin, within the cap, never emptying a bin.

    The partner is another bin of the same slot (with more than ``SLOT_PARTNERS + 1`` ranks, one
    of its :data:`SLOT_PARTNERS` lightest), or one of the :data:`SLOT_PARTNERS` bins of other
    slots with the most room below their own slot's maximum (a trade that lifts such a bin but
    not above its slot's maximum costs nothing). A step applies the trade with the largest
    gain, the drop of this slot's maximum minus the rise of the partner slot's maximum; a trade
    of zero gain is taken only if it lowers the heaviest bin and lifts no slot's maximum (this
    resolves ties at the top). Slots are visited heaviest excess first, each until no trade gains
    or it is within :data:`SLOT_CLOSE_ENOUGH` of its mean (or, where set, within
    :data:`SLOT_MIN_EXCESS` of the step), for at most :data:`SLOT_PASSES`
    passes. ``bins.moves=False`` allows swaps only (each bin keeps its group count:
    ``equal_samples``). Changes ``bins`` in place, its groups sorted at the end. Every step is O(t + s * SLOT_PARTNERS * s) vectorised for ``s`` groups
    per bin and ``t`` bins; swaps skip partner groups whose bound (the gain can exceed neither
    the delta nor the partner's room) is below the best move, and score the heavy bin's first
    :data:`SWAP_FIRST_ROWS` groups (its lightest, past TRADE_ITEMS groups) first, stopping
    once they reach the step's upper bound: the same trade as the full matrix, usually at a
    fraction of its cost. A slot whose last step found no trade is not searched again (the
    attempt still counts) until its own bins, its partners of other slots or their slots'
    bins have changed: the search would find none again.
    """
    if all(len(slot) < 2 for slot in slots):
        return
    parts, tokens, work, capacity, moves = bins.parts, bins.tokens, bins.work, bins.capacity, bins.moves
    bin_tokens, bin_work = bins.bin_tokens, bins.bin_work  # kept current by bins.exchange
    slot_of = np.empty(len(parts), dtype=np.int64)
    for index, slot in enumerate(slots):
        slot_of[slot] = index
    grid = [np.asarray(slot, dtype=np.int64) for slot in slots]
    flat_bins = np.concatenate(grid) if grid else np.zeros(0, dtype=np.int64)
    starts = np.cumsum([0] + [len(slot) for slot in slots[:-1]]).astype(np.int64)
    big = np.iinfo(np.int64).min
    # The groups trades look at (:func:`_some`), one row of TRADE_ITEMS per bin, padded: a step
    # gathers its partners' rows in one indexing instead of a list per bin. A bin's row is
    # written again only when a trade changes the bin.
    # ``pick_work``: the workload of each picked group, the padding past a row's end beyond any
    # bin's (a swap with it can gain nothing: its bound is negative), so no step masks the padding.
    pick = np.zeros((len(parts), TRADE_ITEMS), dtype=np.int64)
    pick_work = np.empty((len(parts), TRADE_ITEMS), dtype=np.int64)
    picked = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))  # how much of each row is real

    def look_at(b: int) -> None:
        items = _some(parts[b], work)
        pick[b, :len(items)] = items
        pick_work[b, :len(items)] = work.take(items)
        pick_work[b, len(items):] = PADDING
        picked[b] = len(items)

    small = np.flatnonzero(picked <= TRADE_ITEMS)  # rows that are the whole bin, in its order: at once
    if len(small):
        flat = np.fromiter(chain.from_iterable(parts[b] for b in small.tolist()), dtype=np.int64)
        first = np.repeat(np.cumsum(picked[small]) - picked[small], picked[small])
        pick[np.repeat(small, picked[small]), np.arange(len(flat)) - first] = flat
        real = np.arange(TRADE_ITEMS)[None, :] < picked[small][:, None]
        pick_work[small] = np.where(real, work[pick[small]], PADDING)
    for b in np.flatnonzero(picked > TRADE_ITEMS).tolist():
        look_at(b)

    roomiest: list[Any] = [-1, None]  # [slot, its roomiest partners of other slots] while valid
    edits = [0] * len(grid)  # trades that changed each slot's bins so far
    stuck: list[Any] = [None] * len(grid)  # per slot: what its last step that found no trade depended on

    def inputs_of(s: int, others: np.ndarray) -> tuple[int, bytes, list[int]]:
        return edits[s], others.tobytes(), [edits[o] for o in slot_of.take(others).tolist()]

    def trade(s: int) -> bool:
        slot = grid[s]
        values = bin_work.take(slot)  # take: the fancy index's result, at a fraction of its cost
        order = np.argsort(-values, kind="stable")
        heavy, top = int(slot[order[0]]), int(values[order[0]])
        # ndarray.mean() on ints: a float64 sum divided by the count (the same float, cheaper call)
        mean = float(np.add.reduce(values, dtype=np.float64)) / len(values)
        if top <= SLOT_CLOSE_ENOUGH * mean:
            return False  # also every slot of one bin
        if SLOT_MIN_EXCESS and top - mean <= SLOT_MIN_EXCESS * float(np.add.reduce(maxima, dtype=np.float64)):
            return False
        second = int(values[order[1]])
        third = int(values[order[2]]) if len(slot) > 2 else 0
        # the slot's other bins (on more than SLOT_PARTNERS ranks its SLOT_PARTNERS lightest), in slot order
        kept = order[1:] if len(slot) <= SLOT_PARTNERS + 1 else order[::-1][:SLOT_PARTNERS]
        inner = slot.take(np.sort(kept))
        # The SLOT_PARTNERS roomiest bins of other slots, ties by index: every bin at or above the
        # (SLOT_PARTNERS + this slot's size)-th largest room, less this slot's, then sorted. O(t).
        # That is the first SLOT_PARTNERS of the other slots' bins with room, whatever this slot's
        # rooms are: after a trade inside this slot (or none) the next step of it reuses them.
        if roomiest[0] == s:
            others = roomiest[1]
        else:
            wanted = SLOT_PARTNERS + len(slot)
            if len(room) > wanted:
                threshold = max(int(np.partition(room, len(room) - wanted)[len(room) - wanted]), 1)
                others = np.flatnonzero(room >= threshold)
            else:
                others = np.flatnonzero(room > 0)
            others = others[slot_of[others] != s]
            others = others[np.lexsort((others, -room[others]))][:SLOT_PARTNERS]
            roomiest[:] = [s, others]
        # A step depends on this slot's bins and on its partners of other slots and their slots'
        # bins: where none of these changed since this slot's last step found no trade, neither can this one.
        if stuck[s] is not None and stuck[s] == inputs_of(s, others):
            return False
        partners = np.concatenate((inner, others))  # in-slot ones first: one gain formula each
        if not len(partners):
            return False
        h_items = pick[heavy, :picked[heavy]]
        h_work, h_tok = work.take(h_items), tokens.take(h_items)
        n_in, n_partners, rise = len(inner), len(partners), top - second
        # Every trade's gain, in one formula for both kinds of partner: a trade of ``d`` workload
        # (d > 0) with partner bin p gains min(d, A[p], B[p] - d), and is taken iff d <= C[p].
        # A bin of this slot (its new maximum is the largest of the heavy bin, the partner and the
        # rest; taken if the partner stays below the old maximum): A = fall (top - rest), B =
        # headroom (top - its workload), C = headroom - 1. A bin of another slot, ``space`` below
        # its slot's maximum (its maximum rises by what it passes it by): the gain min(d, rise) -
        # max(d - space, 0) is min(d, min(space, rise), space + rise - d), taken at a tie at the
        # top (rise = 0) if it lifts no maximum (d <= space), else if it gains (d <= space + rise
        # - 1, and space > 0). Row 3 is each partner's room for tokens.
        params = np.empty((4, n_partners), dtype=np.int64)
        fall, headroom, bound_c, p_room = params[0], params[1], params[2], params[3]
        headroom[:n_in] = top - bin_work.take(inner)
        np.subtract(headroom[:n_in], 1, out=bound_c[:n_in])
        fall[:n_in] = rise
        if len(slot) <= SLOT_PARTNERS + 1 and n_in:  # the slot's second bin is a partner: the rest is the third
            fall[int(order[1]) - (1 if order[0] < order[1] else 0)] = top - third
        space = room.take(others)  # kept current by refresh: below the other slot's maximum
        np.minimum(space, rise, out=fall[n_in:])
        np.add(space, rise, out=headroom[n_in:])
        if rise == 0:
            bound_c[n_in:] = space
        else:
            bound_c[n_in:] = np.where(space > 0, space + (rise - 1), -1)
        np.subtract(capacity, bin_tokens.take(partners), out=p_room)

        best = None  # (gain, delta, kind, i, partner, column)
        if len(parts[heavy]) > 1 and moves and int(h_tok.min()) <= int(p_room.max()):
            # a move depends on the partner bin only: one column per partner bin
            delta = h_work[:, None]
            ok = (h_tok[:, None] <= p_room) & (delta > 0) & (delta <= bound_c)
            score = np.where(ok, np.minimum(np.minimum(delta, fall), headroom - delta), big)
            flat = int(np.argmax(score))
            if score.flat[flat] > big:
                i, c = divmod(flat, n_partners)
                best = (int(score.flat[flat]), int(h_work[i]), 0, i, c, -1)
        # A swap gains at most its delta, and at most min(A, B) (top - max(rest, partner) in
        # this slot, min(rise, space) in another): columns that cannot reach the best move's gain
        # (or that no heavy group outweighs) cannot win, and are left out, as are the rows'
        # padding (priced out by its workload). Columns run partner by partner, TRADE_ITEMS each.
        p_work = pick_work.take(partners, axis=0)
        bound = np.minimum(int(h_work.max()) - p_work, np.minimum(fall, headroom)[:, None])
        keep = np.flatnonzero(bound >= (best[0] if best is not None else 0))
        if len(keep):
            at = keep // TRADE_ITEMS
            p_items = pick.take(partners, axis=0)
            k_work, k_tok = p_work.ravel().take(keep), tokens.take(p_items.ravel().take(keep))
            k_fall, k_headroom, k_bound, k_room = params.take(at, axis=1)
            ceiling = int(bound.max())  # a kept column's bound: kept ones are the largest
            least_shift = int(bin_tokens[heavy]) - capacity  # the heavy bin's room, negated
            found = (big, -1, -1)  # (score, row, column): the first maximum in row-major order
            # Rows in two blocks: no swap gains more than ``ceiling``, so once the first block
            # reaches it the first maximum is there (usually: the block's few lightest groups).
            for rows in (slice(0, SWAP_FIRST_ROWS), slice(SWAP_FIRST_ROWS, None)):
                delta = h_work[rows, None] - k_work
                if delta.size == 0:
                    continue
                shift = h_tok[rows, None] - k_tok
                ok = (delta > 0) & (delta <= k_bound) & (shift <= k_room) & (shift >= least_shift)
                score = np.where(ok, np.minimum(np.minimum(delta, k_fall), k_headroom - delta), big)
                flat = int(np.argmax(score))
                if int(score.flat[flat]) > found[0]:
                    i, c = divmod(flat, len(keep))
                    found = (int(score.flat[flat]), i + rows.start, c)
                if found[0] >= ceiling:
                    break
            if found[0] > big:
                _, i, c = found
                candidate = (found[0], int(h_work[i] - k_work[c]), 1, i, int(at[c]), int(keep[c]))
                if best is None or candidate[:2] > best[:2]:
                    best = candidate
        if best is None:
            stuck[s] = inputs_of(s, others)
            return False
        _, _, kind, i, c, column = best
        group, target = int(h_items[i]), int(partners[c])
        exchanges = [(group, heavy, target)]
        if kind == 1:
            exchanges.append((int(p_items.flat[column]), target, heavy))
        for g, src, dst in exchanges:
            bins.exchange(g, src, dst)
        look_at(heavy)
        look_at(target)
        for touched in {s, int(slot_of[target])}:
            refresh(touched)
        if int(slot_of[target]) != s:
            roomiest[0] = -1  # another slot's rooms changed: choose again
        return True

    def refresh(s: int) -> None:  # slot s's maximum and its bins' room below it, after a trade
        edits[s] += 1
        values = bin_work.take(grid[s])
        top = values.max()
        maxima[s] = top
        room.put(grid[s], top - values)

    maxima = np.maximum.reduceat(bin_work[flat_bins], starts)  # every slot's heaviest bin
    room = maxima[slot_of] - bin_work  # how far each bin is below its slot's maximum
    if budget is None:  # trade attempts in all, failed ones included
        budget = SLOT_BUDGET_PER_SLOT * len(grid) + 64

    def steps_of(s: int) -> int:  # trades of slot s per pass, at most: 4 per group, plus 16
        if 4 * len(grid[s]) + 16 >= SLOT_STEPS:  # no bin is ever empty: no need to count the groups
            return SLOT_STEPS
        return min(4 * sum(len(parts[b]) for b in grid[s].tolist()) + 16, SLOT_STEPS)

    for _ in range(SLOT_PASSES):
        excess = [int(bin_work[g].max()) - float(bin_work[g].mean()) for g in grid]
        changed = False
        for s in sorted(range(len(grid)), key=lambda s: (-excess[s], s)):
            for _ in range(steps_of(s)):
                budget -= 1
                if budget < 0 or not trade(s):
                    break
                changed = True
        if not changed or budget < 0:
            break
    bins.sort()


def _ranks_within_slots(slots: list[list[int]], bin_work: Sequence[int], dp: int) -> list[list[int]]:
    """Place each slot's bins on ranks (one per rank) so that rank totals are balanced too.

    Slots in order of their heaviest bin; each slot's bins, heaviest first, go to the ranks
    lightest first (LPT across slots), then pairwise exchanges inside one slot between the
    heaviest and the lightest rank while they narrow the gap (at most ``4 * slots``). Which bin
    sits on which rank inside a slot does not change the per-micro-batch step time, only the
    per-step one. Returns the grid: ``grid[s][r]`` is the bin of rank ``r`` in slot ``s``.
    O(slots * dp log dp + exchanges * slots).
    """
    totals = [0] * dp
    grid: list[list[int]] = []
    for slot in slots:
        row = [-1] * dp
        lightest = sorted(range(dp), key=lambda r: (totals[r], r))
        for rank, b in zip(lightest, sorted(slot, key=lambda b: (-int(bin_work[b]), b))):
            row[rank] = b
            totals[rank] += int(bin_work[b])
        grid.append(row)
    for _ in range(4 * len(grid)):
        heavy = max(range(dp), key=lambda r: (totals[r], -r))
        light = min(range(dp), key=lambda r: (totals[r], r))
        diff = totals[heavy] - totals[light]
        best: Optional[tuple[int, int]] = None  # (gap after, slot)
        for s, row in enumerate(grid):
            delta = int(bin_work[row[heavy]]) - int(bin_work[row[light]])
            if 0 < delta < diff and (best is None or abs(diff - 2 * delta) < best[0]):
                best = (abs(diff - 2 * delta), s)
        if best is None:
            break
        row = grid[best[1]]
        delta = int(bin_work[row[heavy]]) - int(bin_work[row[light]])
        row[heavy], row[light] = row[light], row[heavy]
        totals[heavy] -= delta
        totals[light] += delta
    return grid


#: Steps of the rank polish per rank (see :func:`_polish_ranks`).
POLISH_STEPS_PER_RANK = 4


def _polish_ranks(bins: _Bins, grid: list[list[int]]) -> None:
    """Even out rank totals without touching any slot's maximum: single-group moves and swaps
    between the heaviest and the lightest rank's micro-batches of one slot, where the receiving
    micro-batch stays at or below its slot's maximum and within the cap.

    Each step applies, over all slots, the trade whose shift is nearest to half the two ranks'
    gap (and below the gap); at most ``POLISH_STEPS_PER_RANK * dp`` steps, stopping when no
    trade narrows the gap or the heaviest rank is within :data:`SLOT_CLOSE_ENOUGH` of the mean. The per-micro-batch step time cannot get worse; the per-step one
    gets better. ``bins.moves=False``: swaps only. Changes ``bins`` in place, its groups sorted
    at the end. O(steps * t * s^2) vectorised, ``s`` groups per bin.
    """
    dp = len(grid[0]) if grid else 0
    if dp < 2:
        return
    parts, tokens, work, capacity, moves = bins.parts, bins.tokens, bins.work, bins.capacity, bins.moves
    bin_tokens, bin_work = bins.bin_tokens, bins.bin_work  # kept current by bins.exchange
    cells = np.asarray(grid, dtype=np.int64)  # [slots, dp] bins
    for _ in range(POLISH_STEPS_PER_RANK * dp):
        totals = bin_work[cells].sum(axis=0)
        heavy, light = int(np.argmax(totals)), int(np.argmin(totals))
        diff = int(totals[heavy] - totals[light])
        if diff <= 0 or totals[heavy] <= SLOT_CLOSE_ENOUGH * float(totals.mean()):
            break
        maxima = bin_work[cells].max(axis=1)
        best: Optional[tuple[int, int, int, int, int]] = None  # (gap, slot, kind, group out, group in)
        for slot in range(len(cells)):
            a, b = int(cells[slot, heavy]), int(cells[slot, light])
            allowance = int(maxima[slot] - bin_work[b])
            if allowance <= 0:
                continue
            a_items, b_items = _some(parts[a], work), _some(parts[b], work)
            limit = min(allowance, diff - 1)
            if moves and len(parts[a]) > 1:
                w = work[a_items]
                ok = (w > 0) & (w <= limit) & (tokens[a_items] <= capacity - bin_tokens[b])
                if ok.any():
                    gaps = np.where(ok, np.abs(diff - 2 * w), np.iinfo(np.int64).max)
                    i = int(np.argmin(gaps))
                    if best is None or int(gaps[i]) < best[0]:
                        best = (int(gaps[i]), slot, 0, int(a_items[i]), -1)
            delta = work[a_items][:, None] - work[b_items][None, :]
            shift = tokens[a_items][:, None] - tokens[b_items][None, :]
            ok = (delta > 0) & (delta <= limit) & (shift <= capacity - bin_tokens[b]) & (-shift <= capacity - bin_tokens[a])
            if ok.any():
                gaps = np.where(ok, np.abs(diff - 2 * delta), np.iinfo(np.int64).max)
                i, j = divmod(int(np.argmin(gaps)), len(b_items))
                if best is None or int(gaps[i, j]) < best[0]:
                    best = (int(gaps[i, j]), slot, 1, int(a_items[i]), int(b_items[j]))
        if best is None:
            break
        _, slot, kind, out_group, in_group = best
        a, b = int(cells[slot, heavy]), int(cells[slot, light])
        bins.exchange(out_group, a, b)
        if kind == 1:
            bins.exchange(in_group, b, a)
    bins.sort()


def _aligned(
    parts: list[list[int]], tokens: np.ndarray, work: np.ndarray, capacity: int, dp_size: int,
    budget: Optional[int] = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Steps 4-6 of :func:`build_dp_schedule` on one partition: slots, evening (at most
    ``budget`` trade attempts where given), ranks, polish."""
    bins = _Bins(sorted(sorted(part) for part in parts), tokens, work, capacity, moves=True)  # independent of the partitioner
    slots = _slots_from_bins(bins.parts, bins.bin_work, dp_size)
    _even_slots(bins, slots, budget)
    grid = _ranks_within_slots(slots, bins.bin_work, dp_size)
    _polish_ranks(bins, grid)
    return bins.parts, grid


def _slot_cost(parts: list[list[int]], grid: list[list[int]], work: np.ndarray) -> tuple[int, int]:
    """(sum over slots of the heaviest bin, heaviest rank total): the two step times, in order."""
    cells = _part_sums(work, parts)[np.asarray(grid, dtype=np.int64)]
    return int(cells.max(axis=1).sum()), int(cells.sum(axis=0).max())
