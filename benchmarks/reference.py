"""The baseline every benchmark figure is a ratio against: the older strict KK loop.

This is the design seqbal replaces, written the way verl's ``seqlen_balancing.py`` writes it:
a pure-Python k-way Karmarkar-Karp (every state holds ``k`` set objects, merged pairwise, so
O(n k log k) interpreter steps and O(n k) Python objects) run on workloads
``24576 * s + s * s``, starting at ``ceildiv(total, cap)`` and adding one micro-batch while any
micro-batch is over the cap. Single rank, no forced groups beyond summing them.

It is kept deliberately unoptimised: it is the cost users pay today. Its running time is
predicted with :func:`predicted_seconds` so the benchmark can skip cases that would take more
than a minute instead of stalling.
"""

from __future__ import annotations

import heapq
import time
from typing import Optional, Sequence

#: Linear coefficient of the workload model the reference balances (verl's constant).
REFERENCE_LINEAR_COEFFICIENT = 24576


def ceildiv(a: int, b: int) -> int:
    return -(a // -b)


def reference_workload(length: int) -> int:
    return REFERENCE_LINEAR_COEFFICIENT * length + length * length


class _Set:
    __slots__ = ("sum", "items")

    def __init__(self) -> None:
        self.sum = 0
        self.items: list[tuple[int, int]] = []

    def merge(self, other: "_Set") -> None:
        self.items.extend(other.items)
        self.sum += other.sum

    def __lt__(self, other: "_Set") -> bool:
        if self.sum != other.sum:
            return self.sum < other.sum
        if len(self.items) != len(other.items):
            return len(self.items) < len(other.items)
        return self.items < other.items


class _State:
    __slots__ = ("sets", "k")

    def __init__(self, items: list[tuple[int, int]], k: int) -> None:
        self.k = k
        self.sets = [_Set() for _ in range(k)]
        for position, (index, value) in enumerate(items):
            self.sets[position].items.append((index, value))
            self.sets[position].sum += value
        self.sets.sort(reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].sum - self.sets[-1].sum

    def merge(self, other: "_State") -> None:
        for i in range(self.k):
            self.sets[i].merge(other.sets[self.k - 1 - i])
        self.sets.sort(reverse=True)

    def __lt__(self, other: "_State") -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0] > other.sets[0]


def reference_karmarkar_karp(values: Sequence[int], k: int) -> list[list[int]]:
    """verl-style pure-Python k-way Karmarkar-Karp, ``equal_size=False``. O(n k log k) steps."""
    heap: list[_State] = []
    for value, index in sorted((int(v), i) for i, v in enumerate(values)):
        heapq.heappush(heap, _State([(index, value)], k))
    while len(heap) > 1:
        first = heapq.heappop(heap)
        second = heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [sorted(index for index, _ in s.items) for s in heap[0].sets]


class ReferenceTimeout(RuntimeError):
    """The reference loop ran past its deadline."""


def reference_strict_loop(
    lengths: Sequence[int], cap: int, *, group_size: int = 1, deadline: Optional[float] = None
) -> list[list[int]]:
    """The older strict loop: KK on workloads at ``ceildiv(total, cap)``, +1 until within the cap.

    ``group_size`` sums consecutive samples into forced groups first (the loop then partitions
    groups). ``deadline`` is a ``time.perf_counter()`` value; passing it raises
    :class:`ReferenceTimeout`. Returns sample-index lists.
    """
    lengths = [int(x) for x in lengths]
    groups = [sum(lengths[i:i + group_size]) for i in range(0, len(lengths), group_size)]
    if max(groups) > cap:
        raise ValueError(f"a group has {max(groups)} tokens > cap {cap}")
    workloads = [
        sum(reference_workload(x) for x in lengths[i:i + group_size]) for i in range(0, len(lengths), group_size)
    ]
    k = max(1, ceildiv(sum(groups), cap))
    while True:
        if deadline is not None and time.perf_counter() > deadline:
            raise ReferenceTimeout(f"reference still running at k={k}")
        parts = reference_karmarkar_karp(workloads, k)
        if all(sum(groups[i] for i in part) <= cap for part in parts):
            break
        k += 1
    return [sorted(j for i in part for j in range(i * group_size, i * group_size + group_size)) for part in parts]


#: Seconds per (item x part x log2 part) of one reference KK pass on this kind of machine;
#: calibrated from runs at n=1024 (about 1 s per pass at k~300). Only used to skip cases.
SECONDS_PER_STEP = 3.5e-7


def predicted_seconds(num_groups: int, lower_bound: int) -> float:
    """Rough time of ONE reference KK pass; the loop makes one pass per count it tries."""
    import math

    k = max(lower_bound, 2)
    return SECONDS_PER_STEP * num_groups * k * math.log2(k)
