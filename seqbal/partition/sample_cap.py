"""The second cap: at most ``max_samples`` samples per part, kept by construction.

Attention kernels and per-sequence buffers grow with the number of sequences in a micro-batch,
not only with its tokens (Megatron's RL packer caps sequences per bin for this reason), so a
caller may cap both. The token partitioner is left as it is; this module adds the sample cap
around it in three steps, each of which can only keep or restore it:

1. **the bound**: no partition has fewer than :func:`sample_count_bound` parts, so the count
   search starts there (it is fed as ``min_count``);
2. **the repair** (:func:`repair_sample_cap`): items leave parts over the sample cap,
   smallest tokens first, for the part with the most token room that still has sample room;
   every move keeps the token cap (the receiver has room) and lowers the total sample excess,
   so it ends, at the same count;
3. **the split** (:func:`split_to_sample_cap`): what the repair could not fix is split into
   pieces of at most ``max_samples`` samples. A piece is a subset of its part, so it keeps the
   token cap (and, under the padded cost, ``samples x longest``, and under trimming, its
   window): the result meets both caps whatever the input, at a count a few parts higher.

A rank raised to a larger agreed count gets its partition there from
:func:`raised_within_caps`: a balance at that count repaired to the sample cap, else its own
plan split up to the count.

Why the data-parallel agreement still holds: splitting a part lowers both its tokens and its
samples, so a partition that meets both caps at ``k`` splits into one that meets both at any
``k' >= k`` up to the number of items. The count a rank proposes is therefore reachable on
every rank that proposed less, as with the token cap alone.

The repair trades a little balance for the cap (it moves the shortest items, which weigh
least); the alternative, a sample-aware balance inside KK and the rebalance, would touch every
partitioner for a constraint most callers do not set. Each item weighs the samples it holds
(a forced group of ``g`` samples weighs ``g``).
"""

from __future__ import annotations

import bisect
import heapq
from typing import Optional, Sequence

import numpy as np

from .balance import capped_balanced_partitions
from .bounds import packing_lower_bound
from .packing import split_bins_to_count
from .parts import ceildiv


def sample_count_bound(weights: np.ndarray, max_samples: int) -> int:
    """The fewest parts of at most ``max_samples`` samples that can hold items of these sample
    counts: ``ceildiv(items, max_samples // w)`` for items of one size ``w`` (a forced group
    size), else the packing lower bound of the sample counts. 0 for no items. Items must be
    ``<= max_samples``. Complexity: O(n) for one size, O(n log n) otherwise.

    >>> sample_count_bound(np.array([1] * 20), 8), sample_count_bound(np.array([3] * 6), 8)
    (3, 3)
    """
    if len(weights) == 0:
        return 0
    first = int(weights[0])
    if first > 0 and bool((weights == first).all()):
        return ceildiv(len(weights), max_samples // first)
    return max(ceildiv(int(weights.sum()), max_samples), packing_lower_bound(weights, max_samples))


def with_count_weight(workloads: np.ndarray) -> np.ndarray:
    """Workloads that also weigh an item's count: each plus the mean workload (at least 1).

    The balances (KK, LPT, the rebalance) then even out how many items each part holds as well
    as its compute, so few parts come out over the sample cap for the repair to fix; without
    it, items of nearly no workload (short samples under the quadratic model) all land in the
    same few parts. The price: the true workloads are balanced a little less evenly. The sum
    at most doubles, so int64 sums that fitted still fit where the total is below 2**62. O(n).

    >>> with_count_weight(np.array([10, 0, 0, 2])).tolist()
    [13, 3, 3, 5]
    """
    if len(workloads) == 0:
        return workloads
    return workloads + max(int(workloads.sum()) // len(workloads), 1)


def within_sample_cap(parts: Sequence[Sequence[int]], weights: np.ndarray, max_samples: int) -> bool:
    """Whether every part holds at most ``max_samples`` samples. O(n).

    >>> within_sample_cap([[0, 1], [2]], np.array([1, 1, 1]), 2)
    True
    """
    return all(int(weights[list(part)].sum()) <= max_samples for part in parts)


#: Receivers (parts with sample room, the most token room first) an exchange looks at per step
#: (trades a step's cost against the exchanges it finds; past the roomiest few, one rarely fits).
EXCHANGE_PARTS = 32


def repair_sample_cap(
    parts: Sequence[Sequence[int]],
    tokens: np.ndarray,
    weights: np.ndarray,
    capacity: int,
    max_samples: int,
) -> tuple[list[list[int]], bool]:
    """Move items out of parts over ``max_samples`` samples into parts with room for both.

    Each step takes an over-full part and either moves one of its items, smallest tokens
    first, to the part with the most token room among those with sample room for it, or, when
    no item fits anywhere (the token cap is tight), exchanges a run of two or more of its items
    (consecutive by tokens, the longest run that fits first) for one item of a part with sample
    room (one of the :data:`EXCHANGE_PARTS` roomiest) whose tokens are close to the run's: many
    short samples for one long one. A step never breaks the token cap of a part within it, never empties a part,
    never fills a receiver past the sample cap, and lowers the total sample excess, so the
    repair ends after at most that excess in steps. Returns the parts (sorted) and whether
    every part is now within the sample cap; a part it could not fix is left over it (see
    :func:`split_to_sample_cap`).

    Complexity: O(n log n) for the order, plus O(log k) per move (receivers kept in a heap by
    token room), plus O(EXCHANGE_PARTS * |receiver| * M * s) per exchange (``s`` items in the
    over-full part, ``M`` the sample cap).

    >>> repair_sample_cap([[0, 1, 2], [3]], np.array([4, 1, 1, 5]), np.array([1, 1, 1, 1]), 10, 2)
    ([[0, 2], [1, 3]], True)
    """
    parts = [list(part) for part in parts]
    token_sums = [int(tokens[part].sum()) for part in parts]
    sample_sums = [int(weights[part].sum()) for part in parts]
    over = [p for p, samples in enumerate(sample_sums) if samples > max_samples]
    if not over:
        return [sorted(part) for part in parts], True
    # Receivers: parts with sample room, most token room first (lazy entries, checked on pop).
    heap = [(token_sums[p] - capacity, p) for p, samples in enumerate(sample_sums) if samples < max_samples]
    heapq.heapify(heap)
    max_weight = int(weights.max())

    def live(entry: tuple[int, int]) -> bool:
        return sample_sums[entry[1]] < max_samples and entry[0] == token_sums[entry[1]] - capacity

    def shift(item: int, source: int, target: int) -> None:
        parts[source].remove(item)
        parts[target].append(item)
        size, weight = int(tokens[item]), int(weights[item])
        token_sums[source] -= size
        sample_sums[source] -= weight
        token_sums[target] += size
        sample_sums[target] += weight
        for q in (source, target):
            if sample_sums[q] < max_samples:
                heapq.heappush(heap, (token_sums[q] - capacity, q))

    def move(p: int) -> bool:
        """One item of ``p`` to the roomiest receiver with sample room for it."""
        for item in sorted(parts[p], key=lambda i: (int(tokens[i]), i)):
            size, weight = int(tokens[item]), int(weights[item])
            target, set_aside, no_room = -1, [], False
            while heap:
                entry = heapq.heappop(heap)
                if entry[1] == p or not live(entry):
                    continue  # stale, full, or the over-full part itself: dropped
                set_aside.append(entry)
                if capacity - token_sums[entry[1]] < size:
                    no_room = True  # the roomiest left has no room: none has
                    break
                if sample_sums[entry[1]] + weight <= max_samples:
                    target = entry[1]
                    break
            for entry in set_aside:
                heapq.heappush(heap, entry)
            if target >= 0:
                shift(item, p, target)
                return True
            if no_room or not set_aside:
                return False  # the next items have as many tokens or more
        return False

    def exchange(p: int) -> bool:
        """A run of ``j >= 2`` items of ``p`` (consecutive by tokens) for one of a roomy receiver."""
        members = sorted(parts[p], key=lambda i: (int(tokens[i]), i))
        if len(members) < 2:
            return False
        receivers, seen = [], {p}
        for negative_room, q in heapq.nsmallest(EXCHANGE_PARTS * 2, heap):
            if q not in seen and live((negative_room, q)):
                seen.add(q)
                receivers.append(q)
                if len(receivers) == EXCHANGE_PARTS:
                    break
        if not receivers:
            return False
        sizes = np.concatenate(([0], np.cumsum(tokens[members].astype(np.int64))))
        masses = np.concatenate(([0], np.cumsum(weights[members].astype(np.int64)))).tolist()
        longest_run = min(len(members), max(max_samples - sample_sums[q] for q in receivers) + max_weight + 1)
        # runs[j]: tokens of every run of j consecutive items, ascending in its start (Python
        # lists: a step bisects them hundreds of times, where NumPy's call overhead dominates).
        runs = {j: (sizes[j:] - sizes[:-j]).tolist() for j in range(2, longest_run + 1)}
        room_p = capacity - token_sums[p]
        for q in receivers:
            room_q, sample_room = capacity - token_sums[q], max_samples - sample_sums[q]
            for c in parts[q]:
                size_c, mass_c = int(tokens[c]), int(weights[c])
                # j items out of p, c in: p's tokens must stay within the cap (the run weighs at
                # least c - room_p) and q's too (at most c + room_q); q gains samples, p loses some.
                low, high = size_c - room_p, size_c + room_q
                for j in range(min(longest_run, sample_room + mass_c + 1), 1, -1):
                    run = runs[j]
                    if run[-1] < low or run[0] > high:
                        continue
                    start = bisect.bisect_left(run, low)
                    if run[start] > high:
                        continue
                    gained = masses[start + j] - masses[start] - mass_c
                    if gained <= 0 or gained > sample_room:
                        continue
                    for item in members[start:start + j]:
                        shift(item, p, q)
                    shift(c, q, p)
                    return True
        return False

    fixed = True
    for p in over:
        while sample_sums[p] > max_samples:
            if not (move(p) or exchange(p)):
                fixed = False
                break
    return [sorted(part) for part in parts], fixed


def split_to_sample_cap(parts: Sequence[Sequence[int]], weights: np.ndarray, max_samples: int) -> list[list[int]]:
    """Parts over ``max_samples`` samples cut into pieces of at most that many (first fit of
    their items by samples, largest first); other parts kept. A piece is a subset of its part,
    so every cap the part met on tokens or padded cost still holds. Items must be
    ``<= max_samples``. Complexity: O(n log n + n * pieces of one part).

    >>> split_to_sample_cap([[0, 1, 2, 3, 4], [5]], np.ones(6, dtype=np.int64), 2)
    [[0, 1], [5], [2, 3], [4]]
    """
    kept: list[list[int]] = []
    pieces: list[list[int]] = []
    for part in parts:
        part = sorted(part)
        if int(weights[part].sum()) <= max_samples:
            kept.append(part)
            continue
        bins: list[list[int]] = []
        loads: list[int] = []
        for item in sorted(part, key=lambda i: (-int(weights[i]), i)):
            w = int(weights[item])
            for b, load in enumerate(loads):
                if load + w <= max_samples:
                    bins[b].append(item)
                    loads[b] += w
                    break
            else:
                bins.append([item])
                loads.append(w)
        first, *rest = (sorted(b) for b in bins)
        kept.append(first)
        pieces.extend(rest)
    return kept + pieces


def dealt_within_caps(
    tokens: np.ndarray, weights: np.ndarray, capacity: int, max_samples: int, k: int
) -> Optional[list[list[int]]]:
    """The items by tokens, largest first, dealt to ``k`` parts in snake order (0 .. k-1, then
    k-1 .. 0, ...), if that meets both caps; else None.

    Where the sample cap binds tightly (about ``max_samples`` items per part at ``k``) every
    part must take long and short items alike, and the snake deal does exactly that: each part
    gets ``ceil(n / k)`` items or one fewer, the largest paired with the smallest (for two per
    part the best pairing there is), with near-equal token sums. O(n log n).

    >>> dealt_within_caps(np.array([9, 1, 8, 2]), np.ones(4, dtype=np.int64), 10, 2, 2)
    [[0, 1], [2, 3]]
    """
    if not 1 <= k <= len(tokens):
        return None
    order = np.argsort(-tokens, kind="stable")
    position = np.arange(len(order))
    lap, seat = np.divmod(position, k)
    label = np.empty(len(order), dtype=np.int64)
    label[order] = np.where(lap % 2 == 0, seat, k - 1 - seat)
    if (np.bincount(label, weights=weights, minlength=k) > max_samples).any():
        return None
    if (np.bincount(label, weights=tokens, minlength=k) > capacity).any():
        return None
    by_part = np.argsort(label, kind="stable")
    bounds = np.searchsorted(label[by_part], np.arange(k + 1))
    return [by_part[bounds[c]:bounds[c + 1]].tolist() for c in range(k)]


def padded_runs(longest: np.ndarray, sizes: np.ndarray, capacity: int, max_samples: int) -> list[list[int]]:
    """The fewest parts of padded cost ``samples x longest <= capacity`` and at most
    ``max_samples`` samples, for groups of one size: runs of the groups sorted by their longest
    sample (descending, index breaks ties), each as long as both caps allow.

    A run's cost is set by its first group, and both limits only shrink as a run grows, so the
    usual exchange argument for the padded cost holds with the sample limit too: no partition
    into fewer parts exists where every group has as many samples (with unequal sizes it is a
    feasible partition, not always the fewest). Groups must fit on their own. O(n log n).

    >>> padded_runs(np.array([9, 1, 8, 1, 1]), np.ones(5, dtype=np.int64), 20, 2)
    [[0, 2], [1, 3], [4]]
    """
    order = sorted(range(len(longest)), key=lambda i: (-int(longest[i]), i))
    parts: list[list[int]] = []
    for i in order:
        if parts:
            run = parts[-1]
            samples = sum(int(sizes[j]) for j in run) + int(sizes[i])
            if samples <= max_samples and samples * int(longest[run[0]]) <= capacity:
                run.append(i)
                continue
        parts.append([i])
    return [sorted(run) for run in parts]


def peel_to_sample_cap(
    parts: Sequence[Sequence[int]], tokens: np.ndarray, weights: np.ndarray, capacity: int, max_samples: int
) -> list[list[int]]:
    """Parts over ``max_samples`` samples give up items, smallest tokens first, until within
    it; the items given up are packed into new parts, first fit by tokens (largest first)
    under both caps, appended after the others. Every part loses items or is new, so both
    caps hold; the new parts are about ``max(peeled tokens / capacity, peeled samples /
    max_samples)``, where a split would add one or more per over-full part. Items must be
    within both caps on their own. O(n log n + peeled * new parts).

    >>> peel_to_sample_cap([[0, 1, 2], [3, 4, 5]], np.array([5, 1, 1, 5, 2, 1]), np.ones(6, dtype=np.int64), 10, 2)
    [[0, 2], [3, 4], [1, 5]]
    """
    kept: list[list[int]] = []
    peeled: list[int] = []
    for part in parts:
        part = sorted(part, key=lambda i: (int(tokens[i]), i))
        samples = int(weights[part].sum())
        while samples > max_samples:
            item = part.pop(0)
            samples -= int(weights[item])
            peeled.append(item)
        kept.append(sorted(part))
    bins: list[list[int]] = []
    loads: list[tuple[int, int]] = []
    for item in sorted(peeled, key=lambda i: (-int(tokens[i]), i)):
        size, weight = int(tokens[item]), int(weights[item])
        for b, (load, samples) in enumerate(loads):
            if load + size <= capacity and samples + weight <= max_samples:
                bins[b].append(item)
                loads[b] = (load + size, samples + weight)
                break
        else:
            bins.append([item])
            loads.append((size, weight))
    return kept + [sorted(b) for b in bins]


def capped_pieces(
    parts: Optional[Sequence[Sequence[int]]],
    tokens: np.ndarray,
    weights: np.ndarray,
    capacity: Optional[int],
    max_samples: int,
    *,
    repaired: bool = False,
) -> Optional[list[list[int]]]:
    """``parts`` made to meet the sample cap: repaired (where ``capacity`` is given, the token
    cost, and ``repaired`` does not say it already was), then, where the repair could not,
    peeled (:func:`peel_to_sample_cap`, token cost only) or split
    (:func:`split_to_sample_cap`), whichever gives fewer parts. Same count when the repair
    succeeds, more otherwise; every cap ``parts`` met still holds. None stays None. O(n log n)
    plus the repair.
    """
    if parts is None:
        return None
    if capacity is not None:
        if not repaired:
            parts, fixed = repair_sample_cap(parts, tokens, weights, capacity, max_samples)
            if fixed:
                return parts
        peeled = peel_to_sample_cap(parts, tokens, weights, capacity, max_samples)
        split = split_to_sample_cap(parts, weights, max_samples)
        return peeled if len(peeled) <= len(split) else split
    return split_to_sample_cap(parts, weights, max_samples)


def raised_within_caps(
    own: Sequence[Sequence[int]],
    count: int,
    tokens: np.ndarray,
    weights: np.ndarray,
    capacity: Optional[int],
    max_samples: int,
    *,
    balance_work: np.ndarray,
    candidate: Optional[Sequence[Sequence[int]]] = None,
    split_weights: Optional[np.ndarray] = None,
) -> Optional[list[list[int]]]:
    """A partition into ``count`` parts that meets both caps, given ``own``, one that meets
    both at fewer parts (a rank's own plan, raised to a count agreed with other ranks).

    Tried in order, first success wins:
      1. ``candidate`` (a partition into ``count`` parts within the token cost, if the caller
         has one), as it is if it meets the sample cap, else repaired
         (:func:`repair_sample_cap`, token cost only: ``capacity`` given);
      2. with ``capacity`` given: :func:`~seqbal.partition.capped_balanced_partitions` at
         ``count`` on ``balance_work`` from ``own``, repaired in the same way;
      3. ``own`` split up to ``count`` (:func:`~seqbal.partition.split_bins_to_count`, halves
         balanced on ``split_weights``, default ``tokens``).

    Guarantee: whenever ``own`` meets both caps and ``len(own) <= count <= len(tokens)``, the
    result has ``count`` parts and meets both caps (step 3 cannot fail: a piece is a subset of
    its part, so it keeps the token cap, and any cost a part met, and the sample cap). This is
    why every count from a rank's own up to its number of items can be agreed. Outside that
    range, the result of steps 1-2 or None. ``capacity`` None (padded or windowed cost, which
    the repair does not model) skips the repairs and step 2. Every returned part is sorted.

    Complexity: one balance at ``count`` (see ``capped_balanced_partitions``) and up to two
    repairs, plus O(n log n) for the split.

    >>> raised_within_caps([[0, 1], [2, 3]], 3, np.array([3, 3, 3, 3]), np.ones(4, dtype=np.int64), 6, 2,
    ...                    balance_work=np.array([3, 3, 3, 3]))
    [[1, 3], [0], [2]]
    """
    def tries():
        if candidate is not None:
            yield candidate
        if capacity is not None and len(own) <= count <= len(tokens):
            yield capped_balanced_partitions(tokens, balance_work, capacity, count, feasible=own)

    for parts in tries():
        if parts is None:
            continue
        if within_sample_cap(parts, weights, max_samples):
            return [sorted(part) for part in parts]
        if capacity is not None:
            repaired, fixed = repair_sample_cap(parts, tokens, weights, capacity, max_samples)
            if fixed:
                return repaired
    if not len(own) <= count <= len(tokens):
        return None
    return split_bins_to_count(own, tokens, count, weights=split_weights)
