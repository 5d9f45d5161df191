"""Greedy balances (LPT): the cheap starts of the feasibility tries and the cap-aware fallback.

Largest first into the lightest part is O(n log k) and balances within a small factor of KK;
the count search runs it at every count it tries, so it must cost a fraction of a packing
pass. Heap keys are single ints ``sum << shift | part`` instead of tuples, half again as fast
in the interpreter. :func:`_capped_greedy` skips parts without token room, which makes it the
balance of tight counts, where KK's many-part merges would cost O(n k).
"""

from __future__ import annotations

import heapq
from typing import Optional

import numpy as np

from .parts import _descending

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
