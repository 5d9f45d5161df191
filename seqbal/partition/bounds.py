"""The packing lower bound: where the count search starts.

``ceildiv(total, cap)`` is far below the truth on inputs of items just over half (or a
third) of the cap, and a search that starts there is long. Martello-Toth's L2 and the
Fekete-Schepers dual-feasible bounds catch those shapes in O(n log n) of NumPy work, so the
search starts within a few counts of the answer on every benchmark family.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..validation import IntSequence, as_int_array, check_capacity
from .parts import ceildiv

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
    return _lower_bound(as_int_array(lengths, negative=False), check_capacity(capacity))


def _lower_bound(values: np.ndarray, capacity: int) -> int:
    """:func:`packing_lower_bound` on a checked non-negative int64 array and capacity (the
    count search's call: its items were checked, so they are not converted again)."""
    sizes = np.sort(values)
    if sizes.size == 0 or sizes[-1] == 0:
        return 0
    if len(sizes) <= SMALL_BOUND_ITEMS and capacity <= SMALL_BOUND_CAPACITY:
        bound, total = _martello_toth_small(sizes.tolist(), capacity)
    else:
        bound, total = _martello_toth(sizes, capacity)
    # Fekete-Schepers dual feasible functions u_q, scaled by q to stay in integers:
    # q * u_q(x) = q * x if (q + 1) x is a multiple of C, else floor((q + 1) x / C) * C.
    # They catch "items just over C / (q + 1)" (e.g. 0.34 C: two per bin), which L2 misses.
    # All orders at once, one row each: a few NumPy calls instead of a few per order, which is
    # most of the bound's cost on a small batch.
    scaled = _ORDERS_PLUS_ONE * sizes
    rest = scaled % capacity
    mapped = np.where(rest == 0, _ORDERS * sizes, scaled - rest)  # scaled - rest: floor(scaled / C) * C
    for q, total_q in zip(_ORDER_LIST, mapped.sum(axis=1).tolist()):
        bound = max(bound, -(-total_q // (q * capacity)))  # ceildiv of Python ints, without its checks
    return max(bound, ceildiv(total, capacity))


#: The orders of the Fekete-Schepers bounds, as a column and a list.
_ORDERS = np.arange(2, _DUAL_FEASIBLE_ORDERS + 1, dtype=np.int64)[:, None]
_ORDERS_PLUS_ONE = _ORDERS + 1
_ORDER_LIST = _ORDERS[:, 0].tolist()
#: Up to this many items (and a capacity up to SMALL_BOUND_CAPACITY, where every sum below is
#: exact in int64 and every comparison with C / 2 exact in float64), Martello-Toth's L2 is
#: computed in the interpreter: its dozen NumPy calls cost more than the arithmetic at a few
#: dozen items (at 64 items the whole bound cost a best-fit-decreasing pass).
SMALL_BOUND_ITEMS = 256
SMALL_BOUND_CAPACITY = 2**40


def _martello_toth_small(sizes: list[int], capacity: int) -> tuple[int, int]:
    """:func:`_martello_toth` on a short ascending list, in the interpreter: the same bound
    (every count of the NumPy form is ``n - big + extra``, so the largest leftover decides).
    O(n log n)."""
    n = len(sizes)
    prefix = [0] * (n + 1)
    running = 0
    for i, size in enumerate(sizes):
        running += size
        prefix[i + 1] = running
    big = bisect.bisect_right(sizes, capacity / 2)  # first index with size > C/2
    most = 0  # the largest leftover over the alphas (0 and every distinct size <= C/2)
    previous = -1
    for alpha in [0] + sizes[:big]:
        if alpha == previous:
            continue
        previous = alpha
        j1 = bisect.bisect_right(sizes, capacity - alpha)  # sizes > C - alpha
        if j1 < big:
            j1 = big
        leftover = prefix[big] - prefix[bisect.bisect_left(sizes, alpha)] - ((j1 - big) * capacity - (prefix[j1] - prefix[big]))
        if leftover > most:
            most = leftover
    return n - big + (-(-most // capacity)), running


def _martello_toth(sizes: np.ndarray, capacity: int) -> tuple[int, int]:
    """Martello-Toth's L2 on ascending int64 ``sizes`` and their exact total. O(n log n)."""
    prefix = np.concatenate(([0], np.cumsum(sizes)))
    n = len(sizes)
    half = capacity / 2
    # Candidate alphas: 0 and every distinct item size <= capacity / 2.
    small = sizes[: np.searchsorted(sizes, half, side="right")]  # sorted, so distinct where they step
    alphas = np.concatenate(([0], small[np.flatnonzero(np.diff(small, prepend=-1))]))
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
    return int(np.max(count_j1 + count_j2 + extra)), int(prefix[-1])
