"""Pure partitioning algorithms: balancing, packing under a cap, splitting, capped balancing.

Everything here takes plain Python sequences or NumPy arrays of integers and returns index
lists; nothing here knows about TensorDict or torch.distributed, so it runs in CPU unit tests.

The central design decision is that the partitioner is *capacity-aware* and *monotone in the
count*. The older design ran Karmarkar-Karp (KK) on workloads at ``ceildiv(total, cap)`` and
added one micro-batch at a time while any micro-batch was over the cap: tens of full KK runs
on realistic data, and still more micro-batches than needed, because KK balances quadratic
workload, not tokens. Here the count comes first: it lies between a bin-packing lower bound
and the count of a cap-respecting packing, and counts in between are accepted as soon as
*some* partition into that many cap-respecting parts is found (an LPT start repaired by
moves and swaps). Then the partition is balanced once, at that count (KK on workloads where
it respects the cap, else the repaired partition or a cap-aware greedy), and rebalanced by
moves and swaps that never break the cap. Splitting a part never breaks the cap, so once a
partition into ``m`` parts is known, every count from ``m`` up to the number of items is
feasible: the data-parallel agreement can take the largest count any rank proposes and every
rank succeeds on the first pass. The price is a handful of O(n log n) passes per call instead
of one; the benefit is fewer micro-batches and no search loop of full repartitions.
"""

from __future__ import annotations

import bisect
import heapq
import math
import numbers
from itertools import chain
from typing import Any, NamedTuple, Optional, Sequence, Union

import numpy as np

IntSequence = Union[Sequence[int], np.ndarray]

__all__ = [
    "ceildiv",
    "roundup_divisible",
    "karmarkar_karp",
    "get_seqlen_balanced_partitions",
    "packing_lower_bound",
    "first_fit_partitions",
    "best_fit_decreasing_partitions",
    "split_bins_to_count",
    "repair_over_capacity",
    "rebalance_within_capacity",
    "capped_balanced_partitions",
    "smallest_feasible_partitions",
    "partition_sums",
]


def ceildiv(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for integers, exact for any size (no float rounding).

    O(1).

    >>> ceildiv(7, 3), ceildiv(6, 3), ceildiv(0, 5)
    (3, 2, 0)
    """
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """Smallest multiple of ``b`` that is ``>= a`` (``b`` positive).

    O(1).

    >>> roundup_divisible(7, 4), roundup_divisible(8, 4)
    (8, 8)
    """
    return ceildiv(a, b) * b


def _as_int_array(values: IntSequence, name: str = "lengths") -> np.ndarray:
    """Return ``values`` as a 1-D int64 array, raising ``ValueError`` on anything else, including
    values whose sums could overflow int64 (see :func:`check_int64_sums`)."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(array.shape)}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if array.dtype == object:  # Python ints beyond int64, or objects that are not ints
            if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in array.tolist()):
                _check_total(sum(max(int(v), 0) for v in array.tolist()), name)
        if np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array)) and np.all(np.mod(array, 1) == 0):
            _check_total(float(np.abs(array).max()) * len(array), name)
            array = array.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.size and array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        raise ValueError(f"{name} holds {int(array.max())}, beyond int64")
    array = array.astype(np.int64, copy=False)
    check_int64_sums(array, name=name)
    return array


_INT64_MAX = 2**63 - 1
#: Every sum the partitioner forms (part sums, the bound's scaled sums) stays below
#: ``(_DUAL_FEASIBLE_ORDERS + 1) * total``; a total above this could wrap around in int64.
INT64_SAFE_TOTAL = _INT64_MAX // 11


def _exact_total(values: np.ndarray) -> int:
    """Exact sum of the positive entries of an int64 array, as a Python int. O(n)."""
    positive = values[values > 0]
    if positive.size == 0:
        return 0
    if int(positive.max()) <= _INT64_MAX // len(positive):
        return int(positive.sum())  # cannot wrap
    return sum(positive.tolist())


def _check_total(total: float, name: str) -> None:
    if total > INT64_SAFE_TOTAL:
        raise ValueError(
            f"the {name} sum to {int(total)}, above {INT64_SAFE_TOTAL} (int64 max / 11): sums of "
            f"micro-batches and of the packing bound could overflow int64; use smaller units"
        )


def check_int64_sums(
    tokens: IntSequence, workloads: Union[IntSequence, str, None] = None, *, name: str = "lengths"
) -> None:
    """Raise ``ValueError`` when a sum the partitioner or the planner forms could overflow int64.

    The one guard used by every partitioner entry point (through its input conversion),
    :func:`seqbal.plan_micro_batches` / :func:`seqbal.plan_data_parallel` and
    :func:`seqbal.build_dp_schedule`. It checks the exact (Python int) total of ``tokens``
    against :data:`INT64_SAFE_TOTAL`; with ``workloads`` also their total, where
    ``workloads="default"`` means the default model ``24576 s + s**2`` computed exactly from
    ``tokens`` (so the check runs before the model itself could wrap around).

    Complexity: O(n).

    >>> check_int64_sums([2**61] * 4)
    Traceback (most recent call last):
    ...
    ValueError: the lengths sum to 9223372036854775808, above 838488366986797800 (int64 max / 11): sums of micro-batches and of the packing bound could overflow int64; use smaller units
    """
    array = np.asarray(tokens)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        array = _as_int_array(array, name)  # converts, checks the total, or raises
    elif array.size and array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        raise ValueError(f"{name} holds {int(array.max())}, beyond int64")
    array = array.astype(np.int64, copy=False)
    _check_total(_exact_total(array), name)
    if isinstance(workloads, str):
        if workloads != "default":
            raise ValueError(f"workloads must be values or 'default', got {workloads!r}")
        from .workload import DEFAULT_LINEAR_COEFFICIENT

        positive = array[array > 0]
        if positive.size and int(positive.max()) <= 2**31:  # each workload fits in int64
            total = _exact_total(DEFAULT_LINEAR_COEFFICIENT * positive + positive * positive)
        else:  # Python ints: the squares cannot wrap
            total = sum(DEFAULT_LINEAR_COEFFICIENT * v + v * v for v in positive.tolist())
        _check_total(total, "workloads")
    elif workloads is not None:
        _check_total(_exact_total(_as_int_array(workloads, "workloads")), "workloads")


def partition_sums(values: IntSequence, partitions: Sequence[Sequence[int]]) -> np.ndarray:
    """Sum of ``values`` over each partition, as an int64 array. O(n).

    >>> partition_sums([5, 1, 2], [[0], [1, 2]]).tolist()
    [5, 3]
    """
    return _part_sums(_as_int_array(values, "values"), partitions)


def _part_sums(values: np.ndarray, parts: Sequence[Sequence[int]]) -> np.ndarray:
    """Exact int64 sum of ``values`` over each part (parts may be empty), in one NumPy pass. O(n)."""
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    if not len(parts):
        return np.zeros(0, dtype=np.int64)
    flat = np.fromiter(chain.from_iterable(parts), dtype=np.int64, count=int(sizes.sum()))
    starts = np.cumsum(sizes) - sizes
    sums = np.add.reduceat(np.append(values[flat], 0), starts)  # the 0 makes a final empty part valid
    return np.where(sizes > 0, sums, 0)  # reduceat yields the next value, not 0, for an empty part


# ---------------------------------------------------------------------------------------------
# Karmarkar-Karp (largest differencing method)
# ---------------------------------------------------------------------------------------------


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

    Complexity: O(n log n) heap steps plus O(log k) per inserted part and a C-level list
    insertion of at most ``k`` entries; O(n) memory (a merge tree of parts, resolved at the end).

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
    values = _as_int_array(seqlen_list, "seqlen_list")
    _check_count(k_partitions, "k_partitions")
    if values.size and values.min() < 0:
        index = int(np.argmin(values))
        raise ValueError(f"seqlen_list must be non-negative, got {int(values[index])} at index {index}")
    n, k = len(values), int(k_partitions)
    if k < 1:
        raise ValueError(f"k_partitions must be >= 1, got {k_partitions}")
    if n < k:
        raise ValueError(f"cannot split {n} items into {k} non-empty partitions")
    if equal_size and n % k:
        raise ValueError(f"equal_size needs len(seqlen_list) divisible by k_partitions: {n} % {k} = {n % k}")
    if k == 1:
        return [list(range(n))]

    order = np.lexsort((np.arange(n), values)).tolist()  # ascending value, index breaks ties
    value_list = values.tolist()
    # A state is the list of its non-empty parts as (-sum, -size, part id), in descending
    # (sum, size) order (ascending tuples, so bisect works). Part ids below n are the items
    # themselves; a paired part gets the next id and its two children are recorded.
    children: list[tuple[int, int]] = []
    states: dict[int, list[tuple[int, int, int]]] = {}

    def entry(node: int, parts: list[tuple[int, int, int]]) -> tuple[int, int, int, int]:
        states[node] = parts
        top = -parts[0][0]
        bottom = -parts[-1][0] if len(parts) == k else 0  # an empty part is the smallest
        return (bottom - top, -top, parts[0][1], node)  # largest spread, sum, size; oldest

    if equal_size:
        chunks = [order[offset:offset + k][::-1] for offset in range(0, n, k)]  # i-th largest first
        heap = [entry(node, [(-value_list[i], -1, i) for i in chunk]) for node, chunk in enumerate(chunks)]
    else:  # one item per leaf: spread = sum (k >= 2, so the other parts are empty); inlined
        states.update((node, [(-value_list[i], -1, i)]) for node, i in enumerate(order))
        heap = [(-value_list[i], -value_list[i], -1, node) for node, i in enumerate(order)]
    heapq.heapify(heap)

    next_node = len(heap)
    after_ties = 2 * n  # larger than every part id (there are fewer than 2 n parts)
    while len(heap) > 1:
        parts = states.pop(heapq.heappop(heap)[3])
        other = states.pop(heapq.heappop(heap)[3])
        a, b = len(parts), len(other)
        if b == 1:  # the common merge, with a single item: one pairing or one insertion
            single = other[0]
            if a == k:
                smallest = parts.pop()
                children.append((smallest[2], single[2]))
                single = (smallest[0] + single[0], smallest[1] + single[1], n + len(children) - 1)
            parts.insert(bisect.bisect_right(parts, (single[0], single[1], after_ties)), single)
            states[next_node] = parts  # entry(), inlined on this hot path
            neg_top = parts[0][0]  # sums are negated: spread = bottom - top = neg_top - neg_bottom
            spread = neg_top - (parts[-1][0] if len(parts) == k else 0)
            heapq.heappush(heap, (spread, neg_top, parts[0][1], next_node))
            next_node += 1
            continue
        # Dense view: position i pairs this state's part i with the other's part k - 1 - i;
        # positions below k - b meet an empty part of the other state and stay as they are.
        new: list[tuple[int, int, int, int]] = []  # (-sum, -size, position, part id)
        for i in range(k - b, a):
            mine, theirs = parts[i], other[k - 1 - i]
            children.append((mine[2], theirs[2]))
            new.append((mine[0] + theirs[0], mine[1] + theirs[1], i, n + len(children) - 1))
        for j in range(min(k - a, b)):
            new.append((other[j][0], other[j][1], k - 1 - j, other[j][2]))
        new.sort()  # equal (sum, size): lower position first, as a stable sort of the dense view
        del parts[min(a, k - b):]
        # Each new part goes after every kept part of equal key (the kept parts all have lower
        # positions); ``after_ties`` compares above any part id.
        if len(new) <= 16:
            for neg_sum, neg_size, _, part in new:
                parts.insert(bisect.bisect_right(parts, (neg_sum, neg_size, after_ties)), (neg_sum, neg_size, part))
        else:  # one linear merge: C-level slice copies between binary searches
            merged, start = [], 0
            for neg_sum, neg_size, _, part in new:
                end = bisect.bisect_right(parts, (neg_sum, neg_size, after_ties), start)
                merged += parts[start:end]
                merged.append((neg_sum, neg_size, part))
                start = end
            merged += parts[start:]
            parts = merged
        heapq.heappush(heap, entry(next_node, parts))
        next_node += 1

    # Resolve the merge tree: a paired part's children inherit its final part.
    label = [0] * (n + len(children))
    for part, (_, _, part_id) in enumerate(states[heap[0][3]]):
        label[part_id] = part
    for combined in range(len(children) - 1, -1, -1):
        left, right = children[combined]
        label[left] = label[right] = label[n + combined]
    return _groups_from_assignment(np.array(label[:n], dtype=np.int64), k)


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
    (item-level :func:`karmarkar_karp` takes O(n log n) interpreter steps, 4 to 9 passes of
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


#: Below this many items :func:`_balanced_parts` runs item-level KK: a pass costs a few
#: milliseconds there, and small inputs are where one item out of place costs most.
CHUNKED_KK_MIN_ITEMS = 1024


def _balanced_parts(work: np.ndarray, k: int) -> list[list[int]]:
    """``k`` parts of balanced workload: the better (lighter heaviest part) of two chunked KK
    runs, full chunks (best when items are alike) and half-full chunks (a part holding a long
    sequence can skip chunks, as with item-level KK; best on heavy tails). On the benchmark
    families the better of the two is within 0.6% of item-level KK's heaviest part, at a
    twentieth of its cost. Below :data:`CHUNKED_KK_MIN_ITEMS` items, item-level KK.
    O(n log k) NumPy work with O(n / k) interpreter steps."""
    if len(work) < CHUNKED_KK_MIN_ITEMS or k == 1:
        return karmarkar_karp(work, k, equal_size=False)
    best, best_heaviest = [], 0
    for per_chunk in (k, max(k // 2, 1)):
        parts = _chunked_karmarkar_karp(work, k, per_chunk)
        if not all(parts):  # a part of padding alone (possible with many zero workloads)
            continue
        heaviest = int(_part_sums(work, parts).max())
        if not best or heaviest < best_heaviest:
            best, best_heaviest = parts, heaviest
    return best or karmarkar_karp(work, k, equal_size=False)


def _groups_from_assignment(assignment: np.ndarray, k: int) -> list[list[int]]:
    """Index lists per part from a part label per item; indices ascending. O(n log n)."""
    order = np.argsort(assignment, kind="stable")
    bounds = np.searchsorted(assignment[order], np.arange(k + 1))
    order_list = order.tolist()
    return [order_list[bounds[i]:bounds[i + 1]] for i in range(k)]


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
    _check_count(k_partitions, "k_partitions")
    n = len(seqlen_list)
    if k_partitions < 1 or n < k_partitions:
        raise ValueError(f"number of items [{n}] < k_partitions [{k_partitions}] (or k_partitions < 1)")
    return karmarkar_karp(seqlen_list, k_partitions, equal_size)


# ---------------------------------------------------------------------------------------------
# Bin packing under a capacity
# ---------------------------------------------------------------------------------------------


#: Orders q of the Fekete-Schepers bounds tried by packing_lower_bound (items just over C/(q+1)).
_DUAL_FEASIBLE_ORDERS = 10


def packing_lower_bound(lengths: IntSequence, capacity: int) -> int:
    """Lower bound on the bins of ``capacity`` needed to pack ``lengths``.

    The larger of Martello-Toth's L2 and the Fekete-Schepers dual-feasible-function bounds of
    orders 2..10. Always ``>= ceildiv(sum(lengths), capacity)`` and ``>=`` the number of items
    larger than half the capacity (no two of them share a bin), so it is tight on adversarial
    inputs like "many items just over half (or a third) of the cap", where the plain ceildiv
    bound is far below the truth and a scan starting there would be long.
    Items must already be ``<= capacity``. Returns 0 for an empty or all-zero input.

    Complexity: O(n log n).

    >>> packing_lower_bound([7] * 8, 8), packing_lower_bound([5, 5, 5, 1], 10)
    (8, 2)
    """
    sizes = np.sort(_as_int_array(lengths))
    _check_capacity_value(capacity)
    if sizes.size == 0 or sizes[-1] == 0:
        return 0
    prefix = np.concatenate(([0], np.cumsum(sizes)))
    n = len(sizes)
    half = capacity / 2
    # Candidate alphas: 0 and every distinct item size <= capacity / 2.
    alphas = np.unique(np.concatenate(([0], sizes[sizes <= half])))
    big_start = np.searchsorted(sizes, half, side="right")  # first index with size > C/2
    j1_start = np.searchsorted(sizes, capacity - alphas, side="right")  # sizes > C - alpha
    j3_start = np.searchsorted(sizes, alphas, side="left")  # sizes >= alpha
    j1_start = np.maximum(j1_start, big_start)
    count_j1 = n - j1_start
    count_j2 = j1_start - big_start
    sum_j2 = prefix[j1_start] - prefix[big_start]
    sum_j3 = prefix[big_start] - prefix[j3_start]
    leftover = sum_j3 - (count_j2 * capacity - sum_j2)
    extra = np.where(leftover > 0, -(-leftover // capacity), 0)
    bound = int(np.max(count_j1 + count_j2 + extra))
    # Fekete-Schepers dual feasible functions u_q, scaled by q to stay in integers:
    # q * u_q(x) = q * x if (q + 1) x is a multiple of C, else floor((q + 1) x / C) * C.
    # They catch "items just over C / (q + 1)" (e.g. 0.34 C: two per bin), which L2 misses.
    for q in range(2, _DUAL_FEASIBLE_ORDERS + 1):
        scaled = (q + 1) * sizes
        mapped = np.where(scaled % capacity == 0, q * sizes, (scaled // capacity) * capacity)
        bound = max(bound, ceildiv(int(mapped.sum()), q * capacity))
    return max(bound, ceildiv(int(prefix[-1]), capacity))


def _check_capacity(sizes: np.ndarray, capacity: int) -> None:
    _check_capacity_value(capacity)
    if sizes.size and (sizes < 0).any():
        index = int(np.argmax(sizes < 0))
        raise ValueError(f"length of item {index} is negative ({int(sizes[index])})")
    if sizes.size and sizes.max() > capacity:
        index = int(np.argmax(sizes > capacity))
        raise ValueError(f"item {index} has {int(sizes[index])} tokens and exceeds capacity {capacity}")


def first_fit_partitions(lengths: IntSequence, capacity: int, *, decreasing: bool = False) -> list[list[int]]:
    """First-fit bin packing: each item goes into the first bin with room, else a new bin.

    Items are taken in input order (as the trainers that use first-fit do), or by descending
    length when ``decreasing`` (FFD, at most 11/9 OPT + 6/9 bins). Bins are returned in opening
    order, each an ascending list of item indices; every bin's sum is ``<= capacity``.

    Complexity: O(n * bins) comparisons, vectorised per item with NumPy.

    Raises:
        ValueError: an item is negative or larger than ``capacity``, or ``capacity <= 0``.

    >>> first_fit_partitions([6, 5, 4, 3], 10)
    [[0, 2], [1, 3]]
    """
    sizes = _as_int_array(lengths)
    _check_capacity(sizes, capacity)
    order = np.argsort(-sizes, kind="stable") if decreasing else np.arange(len(sizes))
    free = np.empty(max(len(sizes), 1), dtype=np.int64)
    bins: list[list[int]] = []
    for item in order.tolist():
        size = sizes[item]
        fits = np.flatnonzero(free[: len(bins)] >= size)
        if fits.size:
            target = int(fits[0])
            bins[target].append(item)
            free[target] -= size
        else:
            free[len(bins)] = capacity - size
            bins.append([item])
    return [sorted(b) for b in bins]


def best_fit_decreasing_partitions(lengths: IntSequence, capacity: int) -> list[list[int]]:
    """Best-fit decreasing: largest item first, into the fullest bin that still has room.

    Uses at most as many bins as FFD's bound (11/9 OPT + 6/9) and, on the length mixes of RL
    batches, often one or two fewer than first-fit decreasing, because it keeps large holes
    open for large items. Bins are returned in opening order with ascending indices.

    Complexity: O(n log n) with a sorted list of (free room, bin) pairs (insertions are C-level
    memmoves of at most ``bins`` entries).

    Raises:
        ValueError: an item is negative or larger than ``capacity``, or ``capacity <= 0``.

    >>> best_fit_decreasing_partitions([5, 4, 3, 3, 2, 2, 1], 10)
    [[0, 1, 6], [2, 3, 4, 5]]
    """
    sizes = _as_int_array(lengths)
    _check_capacity(sizes, capacity)
    order = np.lexsort((np.arange(len(sizes)), -sizes)).tolist()
    size_list = sizes.tolist()
    rooms: list[tuple[int, int]] = []  # sorted (free room, bin index)
    bins: list[list[int]] = []
    for item in order:
        size = size_list[item]
        position = bisect.bisect_left(rooms, (size, -1))
        if position < len(rooms):
            room, target = rooms.pop(position)
            bins[target].append(item)
            bisect.insort(rooms, (room - size, target))
        else:
            bins.append([item])
            bisect.insort(rooms, (capacity - size, len(bins) - 1))
    return [sorted(b) for b in bins]


def _reserving_fill_partitions(sizes: np.ndarray, capacity: int) -> list[list[int]]:
    """A cap-respecting packing that fills one bin at a time: the largest item left opens it,
    then it takes the largest item that still leaves room for the smallest item left, and last
    the largest item that fits. Items must be ``<= capacity``.

    Best-fit decreasing puts two large items together and leaves a hole no item fills (two
    items just over a third of the cap, then nothing); reserving room for the smallest item
    makes large-small-middle triples instead. Near a third of the cap this packs 8% fewer bins
    than best-fit decreasing (90,140 against 98,135 for 262,144 samples at cap 4096); on the
    benchmark families it is within 1% of it either way (0.6% fewer on the Qwen rollouts at
    cap 4096, 0.2% more on lognormal lengths), which is why the count search takes the better
    of the two.

    Complexity: O(n log n): a binary search and a union-find lookup ("largest item left at or
    below a position", near O(1) amortised) per item. Bins in opening order, indices ascending.

    >>> sizes = np.array([1500, 1450, 1400, 1300, 1250, 1200])
    >>> _reserving_fill_partitions(sizes, 4096), len(best_fit_decreasing_partitions(sizes, 4096))
    ([[0, 3, 4], [1, 2, 5]], 3)
    """
    n = len(sizes)
    order = np.lexsort((np.arange(n), sizes))  # ascending size, index breaks ties
    size_at = [-1] + sizes[order].tolist()  # position 0 is a sentinel below every item
    item_at = [-1] + order.tolist()
    left_of = list(range(n + 1))  # left_of[p] == p: the item at p is still unpacked

    def largest_left(position: int) -> int:
        """The largest unpacked position <= ``position`` (0 if none), halving the path."""
        while left_of[position] != position:
            left_of[position] = left_of[left_of[position]]
            position = left_of[position]
        return position

    def take(position: int) -> int:
        left_of[position] = position - 1
        return item_at[position]

    bins: list[list[int]] = []
    smallest = 1  # the smallest unpacked position: it only moves up
    for _ in range(n):  # at most n bins; stops when every item is packed
        top = largest_left(n)
        if top == 0:
            break
        room = capacity - size_at[top]
        members = [take(top)]
        while True:
            while smallest <= n and left_of[smallest] != smallest:
                smallest += 1
            if smallest > n or size_at[smallest] > room:
                break
            # The largest item that leaves room for the smallest one; if only the smallest
            # itself does, the largest item that fits, and the bin is done.
            position = largest_left(bisect.bisect_right(size_at, room - size_at[smallest]) - 1)
            last = position <= smallest
            if last:
                position = largest_left(bisect.bisect_right(size_at, room) - 1)
            room -= size_at[position]
            members.append(take(position))
            if last:
                break
        bins.append(sorted(members))
    return bins


def _check_is_partition(bins: Sequence[Sequence[Any]], n: int) -> None:
    """ValueError unless ``bins`` hold every index ``0..n-1`` exactly once. O(n)."""
    seen = np.zeros(n, dtype=bool)
    for position, items in enumerate(bins):
        for item in items:
            if not isinstance(item, (int, np.integer)) or isinstance(item, bool) or not 0 <= item < n:
                raise ValueError(f"bin {position} holds {item!r}, not an index into {n} items")
            if seen[item]:
                raise ValueError(f"item {item} appears twice in bins (again in bin {position})")
            seen[item] = True
    if not seen.all():
        raise ValueError(f"bins hold {int(seen.sum())} of the {n} items; item {int(np.argmin(seen))} is missing")


def _split_in_two(items: list[int], weights: np.ndarray) -> tuple[list[int], list[int]]:
    """Split ``items`` (>= 2) into two non-empty halves of balanced weight (greedy LPT)."""
    ordered = sorted(items, key=lambda i: (-int(weights[i]), i))
    left, right = [ordered[0]], [ordered[1]]
    left_sum, right_sum = int(weights[ordered[0]]), int(weights[ordered[1]])
    for item in ordered[2:]:
        if left_sum <= right_sum:
            left.append(item)
            left_sum += int(weights[item])
        else:
            right.append(item)
            right_sum += int(weights[item])
    return sorted(left), sorted(right)


def split_bins_to_count(
    bins: Sequence[Sequence[int]],
    lengths: IntSequence,
    target: int,
    *,
    weights: Optional[IntSequence] = None,
) -> list[list[int]]:
    """Split bins until there are exactly ``target`` of them.

    Repeatedly takes the heaviest bin with at least two items (by ``weights``, default
    ``lengths``; ties by lowest bin position) and splits it into two halves of balanced weight.
    A half never holds more than the bin it came from, so no cap that the input respected is
    ever broken. Bins already present keep their position; new halves are appended.

    Complexity: O(n log n + (target - len(bins)) log target).

    Raises:
        ValueError: ``bins`` not a partition of the item indices (an index out of range,
            repeated or missing), ``target`` not an int, smaller than the number of bins, or
            larger than the number of items (a bin cannot be empty).

    >>> split_bins_to_count([[0, 1, 2]], [3, 2, 1], 2)
    [[0], [1, 2]]
    """
    sizes = _as_int_array(lengths)
    weight_array = sizes if weights is None else _as_int_array(weights, "weights")
    if len(weight_array) != len(sizes):
        raise ValueError(f"lengths has {len(sizes)} entries but weights has {len(weight_array)}")
    _check_count(target, "target")
    result = [sorted(b) for b in bins]
    _check_is_partition(result, len(sizes))
    n_items = sum(len(b) for b in result)
    if target < len(result):
        raise ValueError(f"cannot split {len(result)} bins down to {target}; splitting only adds bins")
    if target > n_items:
        raise ValueError(f"cannot make {target} non-empty bins from {n_items} items")
    heap = [(-int(weight_array[b].sum()), position) for position, b in enumerate(result) if len(b) > 1]
    heapq.heapify(heap)
    while len(result) < target:
        _, position = heapq.heappop(heap)
        left, right = _split_in_two(result[position], weight_array)
        result[position] = left
        result.append(right)
        for pos in (position, len(result) - 1):
            if len(result[pos]) > 1:
                heapq.heappush(heap, (-int(weight_array[result[pos]].sum()), pos))
    return result


# ---------------------------------------------------------------------------------------------
# Capacity-preserving local search
# ---------------------------------------------------------------------------------------------


class _SortedPairs:
    """A sorted multiset of ``(key, part)`` pairs in blocks of a few hundred: add, remove and
    the searches below cost O(log k + block) instead of the O(k) shift of one flat list, which
    at 10^5 parts dominated the repair."""

    _BLOCK = 256

    def __init__(self, pairs) -> None:
        ordered = sorted(pairs)
        self.blocks = [ordered[i:i + self._BLOCK] for i in range(0, len(ordered), self._BLOCK)]
        self.maxes = [block[-1] for block in self.blocks]

    def add(self, pair: tuple[int, int]) -> None:
        if not self.blocks:
            self.blocks, self.maxes = [[pair]], [pair]
            return
        i = min(bisect.bisect_left(self.maxes, pair), len(self.blocks) - 1)
        block = self.blocks[i]
        bisect.insort(block, pair)
        self.maxes[i] = block[-1]
        if len(block) > 2 * self._BLOCK:
            self.blocks[i:i + 1] = [block[:self._BLOCK], block[self._BLOCK:]]
            self.maxes[i:i + 1] = [block[self._BLOCK - 1], block[-1]]

    def remove(self, pair: tuple[int, int]) -> None:
        i = bisect.bisect_left(self.maxes, pair)
        block = self.blocks[i]
        del block[bisect.bisect_left(block, pair)]
        if block:
            self.maxes[i] = block[-1]
        else:
            del self.blocks[i], self.maxes[i]

    def last(self) -> tuple[int, int]:
        return self.maxes[-1]

    def first_at_least(self, pair: tuple[int, int]) -> Optional[tuple[int, int]]:
        i = bisect.bisect_left(self.maxes, pair)
        if i == len(self.blocks):
            return None
        block = self.blocks[i]
        return block[bisect.bisect_left(block, pair)]

    def last_below(self, pair: tuple[int, int]) -> Optional[tuple[int, int]]:
        """The largest entry smaller than ``pair``, or None."""
        i = bisect.bisect_left(self.maxes, pair)
        if i == len(self.blocks):
            return self.maxes[-1] if self.blocks else None
        j = bisect.bisect_left(self.blocks[i], pair)
        if j:
            return self.blocks[i][j - 1]
        return self.maxes[i - 1] if i else None

    def largest(self, count: int) -> list[tuple[int, int]]:
        """The ``count`` largest entries, descending."""
        out: list[tuple[int, int]] = []
        for block in reversed(self.blocks):
            out.extend(block[::-1][:count - len(out)])
            if len(out) >= count:
                break
        return out

    def smallest(self, count: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for block in self.blocks:
            out.extend(block[:count - len(out)])
            if len(out) >= count:
                break
        return out


class _Bins:
    """Mutable parts with their token and workload sums, for the local searches below.

    Besides the sums it keeps the parts sorted by free room and by workload
    (:class:`_SortedPairs`), so "the fullest part with room for this item", "the parts with
    most room" and "the heaviest and the lightest parts" are binary searches instead of O(k)
    NumPy scans per step.
    """

    def __init__(
        self, parts: Sequence[Sequence[int]], tokens: np.ndarray, workloads: np.ndarray, capacity: int, *, by_work: bool
    ) -> None:
        self.tokens_of = tokens.tolist()
        self.work_of = self.tokens_of if workloads is tokens else workloads.tolist()
        self.capacity = capacity
        self.members: list[list[int]] = [list(p) for p in parts]
        self.tokens: list[int] = _part_sums(tokens, self.members).tolist()
        self.work: list[int] = self.tokens.copy() if workloads is tokens else _part_sums(workloads, self.members).tolist()
        # Keyed (room, -part): the end of the list is the most room, lowest part first among equal
        # rooms, the order of a stable sort by descending room (which the repair's swaps follow).
        self.by_room = _SortedPairs(self._room_pairs())
        self.by_work = _SortedPairs(zip(self.work, range(len(self.work)))) if by_work else None  # the repair needs none

    def _room_pairs(self) -> list[tuple[int, int]]:
        return list(zip([self.capacity - t for t in self.tokens], range(0, -len(self.tokens), -1)))

    def _add(self, part: int, tokens: int, work: int) -> None:
        self.by_room.remove((self.capacity - self.tokens[part], -part))
        self.tokens[part] += tokens
        self.by_room.add((self.capacity - self.tokens[part], -part))
        if self.by_work is not None:
            self.by_work.remove((self.work[part], part))
        self.work[part] += work
        if self.by_work is not None:
            self.by_work.add((self.work[part], part))

    def room(self, part: int) -> int:
        return self.capacity - self.tokens[part]

    def move(self, item: int, source: int, target: int) -> None:
        self.members[source].remove(item)
        self.members[target].append(item)
        self._add(source, -self.tokens_of[item], -self.work_of[item])
        self._add(target, self.tokens_of[item], self.work_of[item])

    def swap(self, item_a: int, bin_a: int, item_b: int, bin_b: int) -> None:
        """Trade ``item_a`` of ``bin_a`` for ``item_b`` of ``bin_b`` (members as two moves would
        leave them; each part's sorted keys updated once)."""
        self.members[bin_a].remove(item_a)
        self.members[bin_b].append(item_a)
        self.members[bin_b].remove(item_b)
        self.members[bin_a].append(item_b)
        tokens = self.tokens_of[item_b] - self.tokens_of[item_a]
        work = self.work_of[item_b] - self.work_of[item_a]
        self._add(bin_a, tokens, work)
        self._add(bin_b, -tokens, -work)

    def result(self) -> list[list[int]]:
        return [sorted(p) for p in self.members]


class _RankedBins(_Bins):
    """:class:`_Bins` on tokens alone (the repair), where a part's members, once a step looks at
    them, are kept sorted by ``(tokens, item)`` as two parallel lists (sizes and items), so
    later steps binary-search them without sorting. Parts are sorted on first use: a try that
    fails at once sorts a few."""

    def __init__(self, parts: Sequence[Sequence[int]], tokens: np.ndarray, capacity: int) -> None:
        super().__init__(parts, tokens, tokens, capacity, by_work=False)
        self._sizes: list[Optional[list[int]]] = [None] * len(self.members)
        self._items: list[Optional[list[int]]] = [None] * len(self.members)

    def _room_pairs(self) -> list[tuple[int, int]]:
        # Parts over the capacity are never a target, so ``by_room`` holds only the others: a
        # step then updates one entry (the target's) instead of two.
        return [(self.capacity - t, -part) for part, t in enumerate(self.tokens) if t <= self.capacity]

    def _add(self, part: int, tokens: int, work: int) -> None:
        room = self.capacity - self.tokens[part]
        if room >= 0:
            self.by_room.remove((room, -part))
        self.tokens[part] += tokens
        if room - tokens >= 0:
            self.by_room.add((room - tokens, -part))

    def ranked(self, part: int) -> tuple[list[int], list[int]]:
        """The part's member sizes, ascending, and its items in the same order (ties by index);
        the lists themselves, kept sorted by :meth:`move` and :meth:`swap`."""
        sizes = self._sizes[part]
        if sizes is None:
            sizes_of = self.tokens_of
            pairs = sorted([(sizes_of[i], i) for i in self.members[part]])
            sizes = self._sizes[part] = [size for size, _ in pairs]
            self._items[part] = [item for _, item in pairs]
        return sizes, self._items[part]

    def _take(self, part: int, item: int) -> None:
        sizes, items = self.ranked(part)
        position = bisect.bisect_left(sizes, self.tokens_of[item])
        while items[position] != item:  # among equal sizes
            position += 1
        del sizes[position], items[position]

    def _put(self, part: int, item: int) -> None:
        sizes, items = self.ranked(part)
        size = self.tokens_of[item]
        position = bisect.bisect_left(sizes, size)
        while position < len(sizes) and sizes[position] == size and items[position] < item:
            position += 1
        sizes.insert(position, size)
        items.insert(position, item)

    def move(self, item: int, source: int, target: int) -> None:
        self._take(source, item)
        self._put(target, item)
        self._add(source, -self.tokens_of[item], 0)
        self._add(target, self.tokens_of[item], 0)

    def swap(self, item_a: int, bin_a: int, item_b: int, bin_b: int) -> None:
        self._take(bin_a, item_a)
        self._take(bin_b, item_b)
        self._put(bin_a, item_b)
        self._put(bin_b, item_a)
        shift = self.tokens_of[item_b] - self.tokens_of[item_a]
        self._add(bin_a, shift, 0)
        self._add(bin_b, -shift, 0)

    def size(self, part: int) -> int:
        items = self._items[part]
        return len(self.members[part]) if items is None else len(items)

    def result(self) -> list[list[int]]:
        return [sorted(members if items is None else items) for members, items in zip(self.members, self._items)]


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
    size = _as_int_array(tokens, "tokens")
    _check_capacity_value(capacity)
    return _repair(parts, size, capacity, max_steps)[0]


def _repair(
    parts: Sequence[Sequence[int]], size: np.ndarray, capacity: int, max_steps: Optional[int]
) -> tuple[Optional[list[list[int]]], int]:
    """:func:`repair_over_capacity` on a validated array, with the number of parts still over
    the capacity when it gives up (0 on success): how far the try was from a partition."""
    state = _RankedBins(parts, size, capacity)
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


#: A swap is looked for in the parts with the most room: this many of them...
REPAIR_SWAP_PARTS = 16
#: ... and this many once the repair is close to done (at most 1 / REPAIR_CLOSE_FRACTION of
#: its over-cap parts left). A repair that gets that far usually fails only for want of a
#: wider search (real_qwen_rollouts, 16,384 samples at cap 4096: the try at the lower bound
#: succeeds with it and fails without), while a repair far from done stays cheap to give up.
REPAIR_SWAP_PARTS_CLOSE = 256
REPAIR_CLOSE_FRACTION = 20


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
    for room, negated in rooms.largest(swap_parts):
        other = -negated
        if room <= 0 or (best is not None and room <= best[0]):
            break  # a swap gains at most the other part's room, and rooms only get smaller
        other_sizes, other_items = state.ranked(other)
        if not other_sizes:
            continue  # an empty part (only if the caller passed one): nothing to trade
        # Only members larger than the other part's smallest item can trade down.
        for position in range(bisect.bisect_right(member_sizes, other_sizes[0]), len(members)):
            item_size = member_sizes[position]
            # need 0 < item_size - other_size <= room; the largest gain is the smallest
            # other item with size >= item_size - room.
            j = bisect.bisect_left(other_sizes, item_size - room)
            if j < len(other_sizes) and other_sizes[j] < item_size:
                gain = min(item_size - other_sizes[j], excess)
                if best is None or gain > best[0]:
                    best = (gain, members[position], other_items[j], other)
        if best is not None and best[0] >= excess:
            break
    if best is None:
        return False
    state.swap(best[1], worst, best[2], best[3])
    return True


#: How many of the lightest parts the heaviest part is paired with, in turn, per rebalance step:
#: REBALANCE_PAIR_ITEMS / (items per part), between 8 and REBALANCE_PARTNERS. A pairing scans
#: the heavy part's items, so parts of a few items afford many partners, large parts few.
REBALANCE_PARTNERS = 32
REBALANCE_PAIR_ITEMS = 256
#: A chunked KK within the cap is polished by the rebalance down to this fraction above the
#: lower bound (the rebalance's own default is 0.1%, where the last steps of a long rebalance
#: gain hundredths of a percent each): item-level KK gets within about 0.001% on slack inputs,
#: the chunked one within 0.2% (real_qwen_rollouts, 1024 samples, cap 32768), and the polish
#: closes that gap in about as many steps as there are parts.
CHUNKED_KK_POLISH = 0.00001


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
    size = _as_int_array(tokens, "tokens")
    work = _as_int_array(workloads, "workloads")
    _check_capacity_value(capacity)
    state = _Bins(parts, size, work, capacity, by_work=True)
    steps = max_steps if max_steps is not None else 2 * len(state.members) + 64
    per_part = max(len(size) // max(len(state.members), 1), 1)
    partners = min(max(REBALANCE_PAIR_ITEMS // per_part, 8), REBALANCE_PARTNERS)
    if not state.members:
        return []
    bound = max(ceildiv(_exact_total(work), len(state.members)), int(work.max()) if work.size else 0)
    stop = bound * (1 + close_enough)
    for _ in range(steps):
        heavy_work, heavy = state.by_work.last()
        if heavy_work <= stop:
            break
        improved = False
        for light_work, light in state.by_work.smallest(partners):
            if light == heavy or light_work >= heavy_work:
                break
            if _rebalance_pair(state, heavy, light, capacity):
                improved = True
                break
        if not improved:
            break
    return state.result()


def _rebalance_pair(state: _Bins, heavy: int, light: int, capacity: int) -> bool:
    work_of, tokens_of = state.work_of, state.tokens_of
    diff = state.work[heavy] - state.work[light]
    room_light = capacity - state.tokens[light]
    room_heavy = capacity - state.tokens[heavy]
    heavy_items = state.members[heavy]
    # A move of workload w improves the pair iff 0 < w < diff; best is w closest to diff / 2.
    if len(heavy_items) > 1:
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
    ranked = sorted([(work_of[i], i) for i in state.members[light]])
    light_work = [w for w, _ in ranked]
    light_items = [item for _, item in ranked]
    best: Optional[tuple[int, int, int]] = None  # (gap, heavy item, light item)
    for item in heavy_items:
        w = work_of[item]
        centre = bisect.bisect_left(light_work, w - diff / 2)  # ideal light-item workload
        for j in range(max(0, centre - 2), min(len(light_items), centre + 2)):
            delta = w - light_work[j]
            if not 0 < delta < diff:
                continue
            token_shift = tokens_of[item] - tokens_of[light_items[j]]
            if token_shift > room_light or -token_shift > room_heavy:
                continue
            gap = abs(diff - 2 * delta)
            if best is None or gap < best[0]:
                best = (gap, item, light_items[j])
    if best is None:
        return False
    state.swap(best[1], heavy, best[2], light)
    return True


# ---------------------------------------------------------------------------------------------
# Capped balancing: the partitioner used by rearrange_micro_batches
# ---------------------------------------------------------------------------------------------

#: KK on workloads is run only when parts hold at least this many items on average: there it
#: balances best and its merges stay cheap. With fewer items per part (long responses, a few
#: per micro-batch) its merges of many-part states make a pass O(n k), and the count is tight
#: anyway, so the cap-aware greedy below balances at O(n log k).
SLACK_ITEMS_PER_PART = 6
#: ... and at small counts, where a pass costs O(n log n + n SMALL_COUNT) whatever the slack.
SMALL_COUNT = 64


def _within(parts: Sequence[Sequence[int]], tokens: np.ndarray, capacity: int) -> bool:
    return bool((_part_sums(tokens, parts) <= capacity).all())


def _check_capacity_value(capacity: Any) -> None:
    if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool):
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")


def _greedy_balance(values: np.ndarray, k: int, order: Optional[list[int]] = None) -> list[list[int]]:
    """Largest value first into the part with the smallest sum (LPT); ``order`` is the items
    by descending value (index breaks ties), computed here if not given. The k largest items
    open the k parts. O(n log k), deterministic; indices within a part are not sorted."""
    if order is None:
        order = _descending(values)
    value_list = values.tolist()
    parts: list[list[int]] = [[item] for item in order[:k]]
    # A heap of single ints ``sum << shift | part`` orders like (sum, part) tuples (values are
    # non-negative) and is half again as fast: no tuple to build or compare per item.
    shift = max(k - 1, 1).bit_length()
    mask = (1 << shift) - 1
    heap = [(value_list[item] << shift) | part for part, item in enumerate(order[:k])]
    heapq.heapify(heap)
    replace = heapq.heapreplace
    for item in order[k:]:
        key = heap[0]
        parts[key & mask].append(item)
        replace(heap, key + (value_list[item] << shift))
    return parts


def _descending(values: np.ndarray) -> list[int]:
    """Item indices by descending value, ascending index among equal values. O(n log n)."""
    return np.lexsort((np.arange(len(values)), -values)).tolist()


def _capped_greedy(tokens: np.ndarray, work: np.ndarray, capacity: int, k: int) -> Optional[list[list[int]]]:
    """LPT on workloads that skips parts without token room: the heaviest item first, into the
    lightest part it fits in. ``None`` if an item fits nowhere or a part stays empty.

    Complexity: O(n log k) heap steps plus the parts skipped for lack of room (put back after
    each item), which are few unless the count is very tight.
    """
    order = np.lexsort((np.arange(len(work)), -work)).tolist()
    work_list, token_list = work.tolist(), tokens.tolist()
    shift = max(k - 1, 1).bit_length()  # heap keys ``workload << shift | part``, as in _greedy_balance
    mask = (1 << shift) - 1
    heap = list(range(k))
    load = [0] * k
    parts: list[list[int]] = [[] for _ in range(k)]
    skipped: list[int] = []
    budget = 2 * len(order) + 64  # skipped parts in total; past it the greedy is not worth it
    for item in order:
        size = token_list[item]
        while heap and load[heap[0] & mask] + size > capacity:
            skipped.append(heapq.heappop(heap))
            budget -= 1
        if not heap or budget < 0:
            return None
        key = heap[0]
        part = key & mask
        parts[part].append(item)
        load[part] += size
        heapq.heapreplace(heap, key + (work_list[item] << shift))
        for entry in skipped:
            heapq.heappush(heap, entry)
        skipped.clear()
    if not all(parts):
        return None
    return [sorted(p) for p in parts]


#: Repair steps a feasibility try may take per part over the cap: a count that is feasible is
#: usually repaired in one or two steps per such part, and a failing try must stay cheap.
REPAIR_STEPS_PER_OVER = 3
#: Searches over at most this many items (and at most SMALL_COUNT parts) try KK starts too,
#: with an unlimited repair: every pass is cheap there, and small inputs are where a missed
#: count costs most (one micro-batch of a few).
THOROUGH_ITEMS = 256
#: Counts tried one by one from the bound before the count search jumps below the packing...
LINEAR_TRIES = 3
#: ... unless a try stalls: every start's repair gets stuck with more than this fraction of its
#: over-cap parts still over (in practice: its first steps find no move or swap for the worst
#: part). The next counts then stall too on every benchmark input, so the search goes on below
#: the packing. A try that fixes even a few parts is not stalled: on
#: ``np.random.default_rng(91).integers(1160, 1570, 255)`` (cap 4096) the try at the bound
#: fixes 3 of 57 and the count three above it works.
STALLED_FRACTION = 0.99


class _Try(NamedTuple):
    """What one feasibility try at a count found."""

    parts: Optional[list[list[int]]]  #: a cap-respecting partition into the count, or None
    on_work: bool  #: ``parts`` came from a start balanced on workloads
    repaired: bool  #: ``parts`` needed a repair (the start broke the cap)
    stalled: bool  #: on failure, every start's repair left most of its over-cap parts over


def _fit_in(
    tokens: np.ndarray,
    work: np.ndarray,
    capacity: int,
    k: int,
    thorough: bool = False,
    orders: Optional[tuple[list[int], list[int]]] = None,
) -> _Try:
    """The feasibility try of the count search: some partition into ``k`` non-empty parts within
    ``capacity``, with the same methods at every count of one search.

    LPT on workloads, then LPT on tokens (largest first into the part with the smallest sum),
    each repaired by :func:`repair_over_capacity` with :data:`REPAIR_STEPS_PER_OVER` steps per
    part over the cap; the first that meets the cap wins. The two start points fail on
    different inputs (tokens evened out leave no room to repair into; workloads evened out
    spread the tokens). ``thorough`` (small searches, where every pass is cheap) adds KK on
    workloads and on tokens as start points and lifts the repair's step limit.
    O(n log k) plus the repair steps; O(n k) more when ``thorough``.
    """
    if k > len(tokens):
        return _Try(None, False, False, True)
    if orders is None:
        orders = (_descending(work), _descending(tokens))
    starts = [(lambda: _greedy_balance(work, k, orders[0]), True), (lambda: _greedy_balance(tokens, k, orders[1]), False)]
    if thorough:
        starts += [(lambda: karmarkar_karp(work, k, equal_size=False), True),
                   (lambda: karmarkar_karp(tokens, k, equal_size=False), False)]
    stalled = True
    for start, on_work in starts:
        parts = start()
        if not all(parts):
            continue
        over = int((_part_sums(tokens, parts) > capacity).sum())
        if not over:
            return _Try(parts, on_work, False, False)
        steps = None if thorough else REPAIR_STEPS_PER_OVER * over + 16
        repaired, left = _repair(parts, tokens, capacity, steps)
        if repaired is not None:
            return _Try(repaired, on_work, True, False)
        stalled = stalled and left > STALLED_FRACTION * over
    return _Try(None, False, False, stalled)


def _has_slack(n: int, k: int) -> bool:
    """Whether KK on workloads is worth running at ``k`` parts (see SLACK_ITEMS_PER_PART)."""
    return k <= SMALL_COUNT or n >= SLACK_ITEMS_PER_PART * k


def capped_balanced_partitions(
    tokens: IntSequence,
    workloads: IntSequence,
    capacity: int,
    k: int,
    *,
    feasible: Optional[Sequence[Sequence[int]]] = None,
) -> Optional[list[list[int]]]:
    """Partition items into exactly ``k`` non-empty parts of at most ``capacity`` tokens each,
    with balanced workload; ``None`` if no such partition was found.

    Tried in order, first success wins:
      1. with slack (at least :data:`SLACK_ITEMS_PER_PART` items per part on average, or at
         most :data:`SMALL_COUNT` parts): KK on workloads (chunked from
         :data:`CHUNKED_KK_MIN_ITEMS` items, see :func:`_balanced_parts`), as it is if it
         respects the cap (best balance), else repaired by :func:`repair_over_capacity`;
      2. the cap-aware greedy: heaviest workload first into the lightest part with token room;
      3. ``feasible``, a known cap-respecting partition with at most ``k`` parts, split up to
         ``k`` parts by :func:`split_bins_to_count` (never breaks the cap);
      4. without ``feasible``: the count search's try in its thorough form (LPT and KK starts,
         on workloads and tokens, repaired without a step limit).
    Results of steps 1 (repaired) to 4 are rebalanced on workload with
    :func:`rebalance_within_capacity`. Step 3 makes the function succeed for every ``k`` between
    ``len(feasible)`` and the number of items: this is the monotonicity the count search and
    the data-parallel agreement rely on.

    Complexity: O(n log n) with slack (one KK pass: item-level below
    :data:`CHUNKED_KK_MIN_ITEMS` items, else O(n log k) in NumPy), O(n log k) heap steps
    otherwise, plus the local searches at O(log k) per step.

    >>> sorted(capped_balanced_partitions([7] * 4, [7] * 4, 8, 4))
    [[0], [1], [2], [3]]
    >>> capped_balanced_partitions([7] * 4, [7] * 4, 8, 3) is None
    True
    """
    size = _as_int_array(tokens, "tokens")
    work = _as_int_array(workloads, "workloads")
    _check_capacity_value(capacity)
    _check_count(k, "k")
    n = len(size)
    if k < 1 or k > n:
        return None
    if len(work) != n:
        raise ValueError(f"tokens has {n} entries but workloads has {len(work)}")
    return _balance_at(size, work, capacity, k, feasible)


def _balance_at(
    size: np.ndarray,
    work: np.ndarray,
    capacity: int,
    k: int,
    feasible: Optional[Sequence[Sequence[int]]],
    found_by: Optional["_Try"] = None,
) -> Optional[list[list[int]]]:
    """The body of :func:`capped_balanced_partitions` on validated arrays. ``found_by`` is the
    count search's try that made ``feasible`` at exactly ``k`` parts, if one did. When that try
    started from a workload balance (LPT), its partition replaces, on inputs of
    :data:`CHUNKED_KK_MIN_ITEMS` items or more, the repair of the balanced KK where the KK
    breaks the cap (a repair costs up to a few best-fit-decreasing passes, and the search
    already paid for one at this count); and if the LPT start itself broke the cap, the KK
    (balanced on workloads too) is not tried at all. On smaller inputs it is the fallback if
    the KK's repair fails."""
    n = len(size)
    candidate = None
    balanced_start = feasible if found_by is not None and found_by.on_work else None
    reuse = balanced_start is not None and n >= CHUNKED_KK_MIN_ITEMS
    if _has_slack(n, k):
        parts = None if reuse and found_by.repaired else _balanced_parts(work, k)
        if parts is not None and _within(parts, size, capacity):
            if n < CHUNKED_KK_MIN_ITEMS:
                return parts  # item-level KK
            return rebalance_within_capacity(parts, size, work, capacity, close_enough=CHUNKED_KK_POLISH)
        # The rebalance below copies the parts, so the search's partition is handed on as it is.
        candidate = balanced_start if reuse else repair_over_capacity(parts, size, capacity) or balanced_start
    if candidate is None:
        candidate = _capped_greedy(size, work, capacity, k)
    if candidate is None and feasible is not None and len(feasible) <= k:
        candidate = split_bins_to_count(feasible, size, k, weights=work)
    if candidate is None and feasible is None:  # no fallback: try hard (callers probing a count)
        candidate = _fit_in(size, work, capacity, k, thorough=True).parts
    if candidate is None:
        return None
    return rebalance_within_capacity(candidate, size, work, capacity)


def _check_count(value: Any, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")


def smallest_feasible_partitions(
    tokens: IntSequence,
    workloads: IntSequence,
    capacity: int,
    *,
    min_count: int = 1,
    step: int = 1,
) -> tuple[int, Optional[list[list[int]]]]:
    """The smallest count ``k`` (``>= min_count``, a multiple of ``step``) at which a
    cap-respecting partition is found, and a balanced partition at that count.

    The count is decided before any balancing. It lies between the bound ``k0`` (the larger
    of ``min_count`` and :func:`packing_lower_bound`, rounded up to ``step``) and the count
    ``b`` of a packing rounded up to ``step``, where a partition is known (split the
    packing): best-fit decreasing, or where that lands above ``k0`` the better of it and
    :func:`_reserving_fill_partitions`. Counts below ``b`` are tried with one feasibility try,
    the same at every count (:func:`_fit_in`: LPT on workloads and on tokens, repaired). The
    search is over the predicate "a partition into at most ``k`` parts is known", which is
    monotone by construction (a known partition splits up to any larger count): it tries
    ``k0`` and the next two counts one by one (fewer if a try stalls, see
    :data:`STALLED_FRACTION`), then ``b - step``, then bisects between the last failure and
    the smallest success, then, since the try itself is not monotone, tries the counts below
    the bisection's last failure downwards until one fails. Then the partition is balanced
    once, at the final count (:func:`capped_balanced_partitions`, reusing the try's partition
    where it can). If the count exceeds the number of items, ``(count, None)`` is returned so
    the caller can report what was needed.

    Complexity: O(n log n) for the bound and the packings; 2 tries when the first stalls and
    the one below the packing fails, about ``4 + log2((b - k0) / step)`` otherwise, each
    O(n log k) plus the repair; one balance.

    >>> smallest_feasible_partitions([7] * 8, [7] * 8, 8)[0]
    8
    >>> smallest_feasible_partitions([5, 5, 5, 5, 4, 4], [5, 5, 5, 5, 4, 4], 10, step=2)[0]
    4
    """
    size = _as_int_array(tokens, "tokens")
    work = _as_int_array(workloads, "workloads")
    _check_capacity(size, capacity)
    _check_count(step, "step")
    _check_count(min_count, "min_count")
    if step < 1 or min_count < 1:
        raise ValueError(f"step and min_count must be >= 1, got step={step}, min_count={min_count}")
    n = len(size)
    k0 = roundup_divisible(max(min_count, packing_lower_bound(size, capacity), 1), step)
    if k0 > n:
        return k0, None
    packing = best_fit_decreasing_partitions(size, capacity)
    if roundup_divisible(len(packing), step) > k0:  # a search would run: another packing may land lower
        filled = _reserving_fill_partitions(size, capacity)
        if len(filled) < len(packing):
            packing = filled
    count, known, found_by = _search_count(size, work, capacity, k0, roundup_divisible(len(packing), step), step, packing)
    if count > n:
        return count, None
    return count, _balance_at(size, work, capacity, count, known, found_by)


def _search_count(
    size: np.ndarray,
    work: np.ndarray,
    capacity: int,
    low: int,
    packed: int,
    step: int,
    packing: list[list[int]],
) -> tuple[int, list[list[int]], Optional[_Try]]:
    """Smallest count in ``[low, packed]`` (multiples of ``step``) where a partition is known,
    with that partition (at most that many parts) and the try that made it at that count
    (``None`` when it is the packing). See :func:`smallest_feasible_partitions`."""
    if low >= packed:
        return low, packing, None
    # Decided once, so every count of this search gets the same try: small inputs get every start.
    thorough = packed <= SMALL_COUNT and len(size) <= THOROUGH_ITEMS
    orders = (_descending(work), _descending(size))  # the same for every try
    failed, found, known, found_by = low - step, packed, packing, None  # the largest count known to fail; the smallest known to work
    # The first LINEAR_TRIES counts one by one (the answer is usually within a few of the
    # bound, and a try can fail just above a count where it works); then one step below the
    # packing, the count most likely to work; then bisection between the last failure and the
    # smallest success. Every probe is the same try, and a success at m settles every count
    # above m (split the partition), so the predicate searched is monotone by construction.
    # A stalled try ends the one-by-one tries (see STALLED_FRACTION); bisection may still
    # come back to their counts.
    probes = [low + i * step for i in range(LINEAR_TRIES)]
    stalled = False
    failures: set[int] = set()  # counts whose try failed
    for count in probes + [packed - step]:
        if not failed < count < found or (stalled and count != packed - step):
            continue
        tried = _fit_in(size, work, capacity, count, thorough, orders)
        if tried.parts is not None:
            found, known, found_by = count, tried.parts, tried
            break
        failed, stalled = count, tried.stalled
        failures.add(count)

    bisected = found - failed > step
    while found - failed > step:  # bisect (failed, found)
        middle = failed + (found - failed) // (2 * step) * step
        tried = _fit_in(size, work, capacity, middle, thorough, orders)
        if tried.parts is not None:
            found, known, found_by = middle, tried.parts, tried
        else:
            failed = middle
            failures.add(middle)
    if bisected:
        # The try is not monotone: it can work below a count where it failed (on rng(91) it
        # works at 89 and 90 and fails at 91, where bisection stops). So the counts below the
        # last failure are tried downwards, until one fails or was seen to fail.
        count = found - 2 * step
        while count >= low and count not in failures:
            tried = _fit_in(size, work, capacity, count, thorough, orders)
            if tried.parts is None:
                break
            found, known, found_by = count, tried.parts, tried
            count -= step
    return found, known, found_by
