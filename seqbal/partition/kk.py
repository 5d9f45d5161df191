"""Karmarkar-Karp (the largest differencing method): balancing without a cap.

KK is the balance verl uses and the best cheap one known for sums of few parts. It is kept
exact and deterministic (integer sums, ties broken by size and position), so a plan is the
same on every machine. Item-level KK costs O(n log n) interpreter steps, 1 to 4 passes of
best-fit decreasing; from :data:`CHUNKED_KK_MIN_ITEMS` items the balance runs a chunked KK
instead, merging whole states of ``k`` parts as NumPy vectors (O(n / k) interpreter steps),
within 0.6% of item-level KK's heaviest part on the benchmark families. Below that size a
pass is cheap and one item out of place costs most, so item-level KK stays.
"""

from __future__ import annotations

import bisect
import heapq
from itertools import repeat

import numpy as np

from ..validation import IntSequence, as_int_array, check_count, flag_argument
from .parts import _groups_from_assignment, _part_sums, ceildiv

# Tuning: where the chunked KK takes over.

#: Below this many items :func:`_balanced_parts` runs item-level KK: a pass costs a few
#: milliseconds there, and small inputs are where one item out of place costs most (trades
#: the chunked KK's twentieth of the cost for item-level balance).
CHUNKED_KK_MIN_ITEMS = 1024


def karmarkar_karp(seqlen_list: IntSequence, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Split item indices into ``k_partitions`` parts of balanced sums (Karmarkar-Karp, LDM).

    Every state is a k-tuple of part sums kept in descending order; the two states with the
    largest spread (max - min) are merged by pairing the largest part of one with the smallest
    of the other, until one state is left. Ties are broken by part size and position, and
    between states by creation order, so the result is deterministic. Empty parts sort after
    non-empty parts of equal sum, which makes every part non-empty whenever
    ``len(seqlen_list) >= k_partitions``.

    A state stores only its non-empty parts (the empty ones are an implicit zero tail), so a
    merge touches only the parts of the smaller state and the overlap: merging a state of
    ``a`` parts with one of ``b`` parts pairs ``max(0, a + b - k)`` of them and inserts the rest.
    Every pairing lowers the number of non-empty parts by one, so there are at most ``n - k``
    of them in the whole run, and the typical merge (a full state and a single item) is one
    binary-search insertion.

    Only merged states go through the heap: the single items wait in one sorted queue, and
    the state just merged is kept out of the heap while its key is below both queues' heads
    (it is the next take anyway). Most merges are then runs of such a state taking the next
    items, done without heap operations, in the order and with the ids that one heap of
    every state would give, so the result is exactly the plain algorithm's.

    Complexity: O(n log n) (heap steps only where a run ends) plus
    O(log k) per inserted part and a C-level list insertion of at most ``k`` entries; O(n)
    memory (a merge tree of parts, resolved at the end).

    Args:
        seqlen_list: non-negative values to balance (lengths or workloads).
        k_partitions: number of parts, >= 1.
        equal_size: if True every part gets ``len(seqlen_list) // k_partitions`` items, which
            requires the length to be divisible by ``k_partitions``.

    Returns:
        ``k_partitions`` lists of indices into ``seqlen_list`` (each in ascending order), in
        descending order of their sums.

    Raises:
        ValueError: ``k_partitions < 1``, fewer items than parts, or ``equal_size`` with a length
            not divisible by ``k_partitions``.

    >>> karmarkar_karp([4, 5, 6, 7, 8], 2, equal_size=False)  # sums 16 and 14
    [[0, 1, 3], [2, 4]]
    """
    values = as_int_array(seqlen_list, "seqlen_list", negative=False)
    k_partitions = check_count(k_partitions, "k_partitions")
    equal_size = flag_argument("equal_size", equal_size)
    n, k = len(values), int(k_partitions)
    if k < 1:
        raise ValueError(f"k_partitions must be >= 1, got {k_partitions}")
    if n < k:
        raise ValueError(f"cannot split {n} items into {k} non-empty partitions")
    if equal_size and n % k:
        raise ValueError(f"equal_size needs len(seqlen_list) divisible by k_partitions: {n} % {k} = {n % k}")
    return _karmarkar_karp(values, k, equal_size)


def _karmarkar_karp(values: np.ndarray, k: int, equal_size: bool) -> list[list[int]]:
    """:func:`karmarkar_karp` on checked arguments: a non-negative int64 array of at least
    ``k >= 1`` items (a multiple of ``k`` with ``equal_size``). The partitioner's own callers
    come here, so a plan does not convert and check its arrays again at every start (at
    n = 64 that check costs about a sixth of a best-fit-decreasing pass)."""
    n = len(values)
    if k == 1:
        return [list(range(n))]

    # A state is the list of its non-empty parts as (-sum, -size, part id), in descending
    # (sum, size) order (ascending tuples, so bisect works). Part ids below n are the items
    # themselves; a paired part gets the next id and its two children are recorded.
    # A state's key is (spread, -top sum, -top size, node) with spread = bottom - top <= 0
    # (sums are negated): the smallest key is the largest spread, then the largest top part,
    # then the oldest state (node ids in creation order: the leaves are nodes 0..n-1, numbered
    # by ascending value and index (with equal_size, the chunks), then the merged states).
    children: list[tuple[int, int]] = []
    states: dict[int, list[tuple[int, int, int]]] = {}
    # The heap holds the merged states by key; the leaves (single items) never change until
    # they are taken, so they wait outside it in key order (largest value first, the lower
    # index among equal values), and each take compares the next leaf's key with the heap's
    # top: the order of takes is that of one heap holding everything. A leaf's key is compared
    # only with merged states' keys, whose nodes are all >= n, so node 0 stands for every
    # leaf's node. ``exhausted`` compares above every key (spreads are <= 0) and ends both
    # queues, so no take checks a length.
    exhausted = (1, 0, 0, 0)
    heap: list[tuple[int, int, int, int]] = [exhausted]
    leaf_keys: list[tuple[int, int, int, int]] = [exhausted]  # in take order
    leaf_parts: list[tuple[int, int, int]] = []  # the leaves' single parts, in the same order
    if equal_size:
        value_list = values.tolist()
        order = np.argsort(values, kind="stable").tolist()  # ascending value, index breaks ties
        for node, offset in enumerate(range(0, n, k)):
            parts = [(-value_list[i], -1, i) for i in reversed(order[offset:offset + k])]  # i-th largest first
            states[node] = parts
            top, bottom = parts[0], parts[-1]
            heap.append((top[0] - bottom[0], top[0], top[1], node))
        heapq.heapify(heap)
    else:  # one item per leaf: spread = -value (k >= 2, so the other parts are empty)
        take = np.argsort(-values, kind="stable")  # largest first, lower index first
        neg_values = (-values[take]).tolist()
        leaf_keys = list(zip(neg_values, neg_values, repeat(-1), repeat(0))) + leaf_keys
        leaf_parts = list(zip(neg_values, repeat(-1), take.tolist()))

    heappush, heappop, add_child = heapq.heappush, heapq.heappop, children.append
    bisect_left, bisect_right, insort_right = bisect.bisect_left, bisect.bisect_right, bisect.insort_right
    next_node = len(states) + len(leaf_parts)
    after_ties = 2 * n  # larger than every part id and node id (there are fewer than 2 n of each)
    next_leaf = 0
    # The state just merged stays "in hand" (outside the heap and ``states``) when its key is
    # below both the heap's top and the next leaf's: it would be the very next take, so the
    # push and pop are skipped. Its node id is assigned as on the heap path, so every key
    # comparison is the one the heap would make. Most merges are such a state taking the
    # next leaf, in runs handled below without the heap.
    hand: list[tuple[int, int, int]] | None = None
    merges_left = next_node - 1  # every merge turns two states into one
    if not merges_left:  # a single chunk (equal_size with n == k): that state is the result
        parts = states[0]
    while merges_left:
        heap_top = heap[0]
        if hand is not None:
            parts = hand
        elif leaf_keys[next_leaf] < heap_top:
            parts = [leaf_parts[next_leaf]]
            next_leaf += 1
        else:
            parts = states.pop(heappop(heap)[3])
            heap_top = heap[0]
        a = len(parts)
        if a == k and leaf_keys[next_leaf] < heap_top:
            # A full state and a single item (the heap's states all have >= 2 parts, so the
            # second take is a single item exactly when it is a leaf): the item pairs with the
            # smallest part. While the result is again below the next leaf, which is below the
            # heap's top, the next merge is the same state with the next leaf: an LPT-like run
            # (the item joins the smallest part) as long as the state keeps the largest spread.
            # The new part's id is above every id in the state, so inserting it after its
            # equals by its own tuple is the insertion after every part of equal (sum, size).
            next_part = n + len(children)
            while True:
                neg_value, _, item = leaf_parts[next_leaf]
                next_leaf += 1
                neg_sum, neg_size, smallest = parts.pop()
                add_child((smallest, item))
                insort_right(parts, (neg_sum + neg_value, neg_size - 1, next_part))
                next_part += 1
                merges_left -= 1
                top = parts[0]  # sums are negated: spread = bottom - top = neg_top - neg_bottom
                key = (top[0] - parts[-1][0], top[0], top[1], next_node)
                if not key < leaf_keys[next_leaf] < heap_top:
                    break
                next_node += 1
        else:
            if leaf_keys[next_leaf] < heap_top:
                # A state of a < k parts and a single item: the item is inserted after the top
                # part (this state was taken before the item, so its top part is not smaller),
                # which leaves the key's (spread, top sum, top size) as they were: its spread is
                # its top sum, an empty part being the smallest. When those three are strictly
                # below the next leaf's and the heap top's, the result, the newest state, is the
                # next take again and takes every following leaf below the heap's top, up to k
                # parts: those insertions are done at once, one merge (and node id) each.
                top = parts[0]
                probe = (top[0], top[0], top[1], after_ties)  # above every node: '<' is strict on the three
                count = 1
                if probe < leaf_keys[next_leaf + 1] and probe < heap_top:
                    count = min(k - a, bisect_left(leaf_keys, heap_top, next_leaf) - next_leaf)
                for neg_sum, neg_size, part in leaf_parts[next_leaf:next_leaf + count]:
                    parts.insert(bisect_right(parts, (neg_sum, neg_size, after_ties)), (neg_sum, neg_size, part))
                next_leaf += count
                merges_left -= count
                next_node += count - 1
            else:
                other = states.pop(heappop(heap)[3])
                merges_left -= 1
                b = len(other)
                if a == k == b:  # two full states: part i pairs with the other's part k - 1 - i
                    base = n + len(children)
                    children += [(mine[2], theirs[2]) for mine, theirs in zip(parts, reversed(other))]
                    # The new part ids grow with the position, so they break ties as it does.
                    parts = sorted([
                        (mine[0] + theirs[0], mine[1] + theirs[1], part)
                        for part, mine, theirs in zip(range(base, base + k), parts, reversed(other))
                    ])
                else:
                    # Dense view: position i pairs this state's part i with the other's part k - 1 - i;
                    # positions below k - b meet an empty part of the other state and stay as they are.
                    new: list[tuple[int, int, int, int]] = []  # (-sum, -size, position, part id)
                    for i in range(k - b, a):
                        mine, theirs = parts[i], other[k - 1 - i]
                        add_child((mine[2], theirs[2]))
                        new.append((mine[0] + theirs[0], mine[1] + theirs[1], i, n + len(children) - 1))
                    for j in range(min(k - a, b)):
                        new.append((other[j][0], other[j][1], k - 1 - j, other[j][2]))
                    new.sort()  # equal (sum, size): lower position first, as a stable sort of the dense view
                    del parts[min(a, k - b):]
                    # Each new part goes after every kept part of equal key (the kept parts all have lower
                    # positions); ``after_ties`` compares above any part id.
                    if len(new) <= 16:
                        for neg_sum, neg_size, _, part in new:
                            position = bisect_right(parts, (neg_sum, neg_size, after_ties))
                            parts.insert(position, (neg_sum, neg_size, part))
                    else:  # one linear merge: C-level slice copies between binary searches
                        merged, start = [], 0
                        for neg_sum, neg_size, _, part in new:
                            end = bisect_right(parts, (neg_sum, neg_size, after_ties), start)
                            merged += parts[start:end]
                            merged.append((neg_sum, neg_size, part))
                            start = end
                        merged += parts[start:]
                        parts = merged
            top = parts[0]
            key = (top[0] - parts[-1][0] if len(parts) == k else top[0], top[0], top[1], next_node)
        if key < heap[0] and key < leaf_keys[next_leaf]:
            hand = parts
        else:
            hand = None
            states[next_node] = parts
            heappush(heap, key)
        next_node += 1

    # Resolve the merge tree: a paired part's children inherit its final part.
    label = [0] * (n + len(children))
    for part, (_, _, part_id) in enumerate(parts):
        label[part_id] = part
    for combined in range(len(children) - 1, -1, -1):
        left, right = children[combined]
        label[left] = label[right] = label[n + combined]
    groups: list[list[int]] = [[] for _ in range(k)]  # at these sizes cheaper than NumPy's grouping
    for item, part in enumerate(label[:n]):
        groups[part].append(item)  # ascending indices within each part
    return groups


def _chunked_karmarkar_karp(values: np.ndarray, k: int, per_chunk: int) -> list[list[int]]:
    """KK (largest differencing) over states of ``k`` parts built from chunks of items.

    The items, by descending value, are cut into chunks of ``per_chunk`` (``<= k``); each chunk
    is a state with one item in each of its first ``per_chunk`` parts and empty (zero) parts
    after them. The two states with the largest spread are merged by pairing the largest part
    of one with the smallest of the other, until one state is left. With ``per_chunk == k``
    this is the balanced largest differencing method (every part gets one item per chunk);
    with ``per_chunk == 1`` it is item-level KK. In between, the empty parts let a part that
    holds a long sequence skip chunks, which item-level KK allows and full chunks do not.

    Complexity: ``n / per_chunk`` merges of O(k log k) NumPy work each: O(n log k) with
    O(n / per_chunk) interpreter steps when ``per_chunk`` is a fixed fraction of ``k``
    (item-level :func:`karmarkar_karp` takes O(n log n) interpreter steps, 1 to 4 passes of
    best-fit decreasing). Deterministic; indices ascending within a part.
    """
    n = len(values)
    order = np.lexsort((np.arange(n), -values))
    chunks = ceildiv(n, per_chunk)
    filled = np.zeros(chunks * per_chunk, dtype=np.int64)
    filled[:n] = values[order]
    sums = np.zeros((chunks, k), dtype=np.int64)
    sums[:, :per_chunk] = filled.reshape(chunks, per_chunk)  # every row descending
    # Every part of every chunk has a name: real slots 0..chunks*per_chunk-1 (slot s holds item
    # order[s] while s < n), then the empty parts.
    real = chunks * per_chunk
    names = np.arange(chunks * k, dtype=np.int64).reshape(chunks, k) + real
    names[:, :per_chunk] = np.arange(real, dtype=np.int64).reshape(chunks, per_chunk)
    states = {row: (sums[row], names[row]) for row in range(chunks)}
    heap = [(int(sums[row, -1] - sums[row, 0]), row) for row in range(chunks)]  # largest spread, oldest
    heapq.heapify(heap)
    parent = np.arange(real + chunks * k, dtype=np.int64)  # a paired part's name points at its partner's
    next_state = chunks
    while len(heap) > 1:
        part_sums, part_names = states.pop(heapq.heappop(heap)[1])
        other_sums, other_names = states.pop(heapq.heappop(heap)[1])
        merged = part_sums + other_sums[::-1]
        parent[other_names[::-1]] = part_names
        descending = np.argsort(-merged, kind="stable")
        states[next_state] = (merged[descending], part_names[descending])
        heapq.heappush(heap, (int(merged[descending[-1]] - merged[descending[0]]), next_state))
        next_state += 1
    _, root_names = states.popitem()[1]
    while True:  # pointer jumping: every name to the root of its chain, O(log chunks) passes
        jumped = parent[parent]
        if np.array_equal(jumped, parent):
            break
        parent = jumped
    part_of_root = np.empty(len(parent), dtype=np.int64)
    part_of_root[root_names] = np.arange(k)
    assignment = np.empty(n, dtype=np.int64)
    assignment[order] = part_of_root[parent[:n]]
    return _groups_from_assignment(assignment, k)


def _balanced_parts(work: np.ndarray, k: int) -> list[list[int]]:
    """``k`` parts of balanced workload: the better (lighter heaviest part) of two chunked KK
    runs, full chunks (best when items are alike) and half-full chunks (a part holding a long
    sequence can skip chunks, as with item-level KK; best on heavy tails). On the benchmark
    families the better of the two is within 0.6% of item-level KK's heaviest part, at a
    twentieth of its cost. Below :data:`CHUNKED_KK_MIN_ITEMS` items, item-level KK.
    O(n log k) NumPy work with O(n / k) interpreter steps."""
    if len(work) < CHUNKED_KK_MIN_ITEMS or k == 1:
        return _karmarkar_karp(work, k, equal_size=False)
    best, best_heaviest = [], 0
    for per_chunk in (k, max(k // 2, 1)):
        parts = _chunked_karmarkar_karp(work, k, per_chunk)
        if not all(parts):  # a part of padding alone (possible with many zero workloads)
            continue
        heaviest = int(_part_sums(work, parts).max())
        if not best or heaviest < best_heaviest:
            best, best_heaviest = parts, heaviest
    return best or _karmarkar_karp(work, k, equal_size=False)


def get_seqlen_balanced_partitions(
    seqlen_list: IntSequence, k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """verl-compatible: KK partitions of ``seqlen_list`` into ``k_partitions`` non-empty parts.

    Same as :func:`karmarkar_karp`, and checks the result: exactly ``k_partitions`` parts, none
    empty, every index exactly once, indices ascending within a part.

    Complexity: as :func:`karmarkar_karp`.

    >>> get_seqlen_balanced_partitions([1, 2, 3, 4], 2, equal_size=True)
    [[0, 3], [1, 2]]
    """
    values = as_int_array(seqlen_list, "seqlen_list", negative=False)  # before len(): a 0-d array has none
    k_partitions = check_count(k_partitions, "k_partitions")
    n = len(values)
    if k_partitions < 1 or n < k_partitions:
        raise ValueError(f"number of items [{n}] < k_partitions [{k_partitions}] (or k_partitions < 1)")
    return karmarkar_karp(values, k_partitions, equal_size)
