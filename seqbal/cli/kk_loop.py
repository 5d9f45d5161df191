"""verl's own micro-batching, re-implemented for ``seqbal plan`` where verl is not installed.

``seqbal plan`` compares with what users run today. Where verl is installed it runs verl's own
code (:mod:`seqbal.cli.verl_run`); this module is the fallback, and it must cost what verl costs,
not what a rewrite could cost: a comparison against a faster copy of verl makes seqbal look
slower than it is. So the partitioner here is verl's Karmarkar-Karp done the way verl 0.9.1
does it (``verl/utils/seqlen_balancing.py``), with the same work:

* every item starts as a state of ``k`` set objects, one holding the item and ``k - 1`` empty:
  ``n * k`` Python objects per pass, where ``k`` is the micro-batch count;
* every merge pairs the ``k`` sets of two states member by member, then re-sorts the ``k``
  sets with a Python-level comparison (sum, then size, then the member lists);
* the heap of states compares states with a Python-level ``__lt__`` (largest spread first).

One pass therefore costs O(n k log k) Python operations (verl's 800-sample batch at cap 4096:
800 items x 94 sets), and the strict loop of verl >= 0.9 repeats it once per extra micro-batch.
The same tie-breaking gives the same partitions, so the counts equal verl's; the test
``tests/test_cli.py`` checks both, and that the time stays within 2x of verl's own, side by side.

Two versions are in use, and users run both:

* verl <= 0.8 (:func:`kk_one_pass_plans`): one KK pass at ``min(groups, ceildiv(tokens, cap))``
  (raised to ``min_num_micro_batch``, MAX over ranks, rounded up to ``num_batches_divided_by``).
  The cap is a target, not a limit: parts can exceed it. verl 0.8.0's KK is line for line the
  one in 0.9.1.
* verl >= 0.9 (:func:`kk_loop_plans`, the strict ``within_limit`` loop): the same start, then
  while any part on any rank is over the cap, ``num_batches_divided_by`` (or 1) more
  micro-batches and KK again. With data-parallel ranks every step is one all-reduce (MIN of
  "within the cap"), so the number of steps is also the number of collectives.

Pure Python and NumPy; nothing here is used by the library's planning.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ..partition import ceildiv, roundup_divisible

__all__ = [
    "verl_karmarkar_karp", "KKLoopResult", "strict_loop", "kk_loop_plans", "OnePassResult", "one_pass", "kk_one_pass_plans",
]

Partitioner = Callable[[list[int], int], list[list[int]]]


class _Set:
    """One of the ``k`` sets of a KK state: its sum and its ``(index, value)`` members."""

    def __init__(self) -> None:
        self.total = 0
        self.members: list[tuple[int, int]] = []

    def put(self, index: int, value: int) -> None:
        self.members.append((index, value))
        self.total += value

    def absorb(self, other: "_Set") -> None:
        for index, value in other.members:  # member by member, as verl does
            self.members.append((index, value))
            self.total += value

    def __lt__(self, other: "_Set") -> bool:
        if self.total != other.total:
            return self.total < other.total
        if len(self.members) != len(other.members):
            return len(self.members) < len(other.members)
        return self.members < other.members


class _State:
    """A KK state: ``k`` sets, kept in descending order; the heap pops the largest spread first."""

    def __init__(self, index: int, value: int, k: int) -> None:
        self.sets = [_Set() for _ in range(k)]
        self.sets[0].put(index, value)
        self.sets = sorted(self.sets, reverse=True)

    def spread(self) -> int:
        return self.sets[0].total - self.sets[-1].total

    def merge(self, other: "_State") -> None:
        """Pair this state's largest set with the other's smallest, and so on; re-sort."""
        k = len(self.sets)
        for i in range(k):
            self.sets[i].absorb(other.sets[k - 1 - i])
        self.sets = sorted(self.sets, reverse=True)

    def __lt__(self, other: "_State") -> bool:
        mine, theirs = self.spread(), other.spread()
        if mine != theirs:
            return mine > theirs
        return other.sets[0] < self.sets[0]


def verl_karmarkar_karp(values: Sequence[int], k: int) -> list[list[int]]:
    """verl's ``get_seqlen_balanced_partitions(values, k, equal_size=False)``, same work, same result.

    Items enter the heap in ascending ``(value, index)`` order, one state each; the two states
    of largest spread are merged until one is left; its sets, each sorted, are the partitions
    (largest sum first). verl checks the result with ``assert``; here a bad input is a
    ``ValueError``.

    Complexity: O(n k log k) Python operations and ``n * k`` set objects, deliberately: that is
    verl's cost (see the module docstring).

    Raises:
        ValueError: ``k < 1``, or fewer items than ``k`` (verl: an AssertionError).

    Examples:
        >>> verl_karmarkar_karp([4, 5, 6, 7, 8], 2)
        [[0, 1, 3], [2, 4]]
    """
    values = [int(v) for v in values]
    if k < 1 or len(values) < k:
        raise ValueError(f"cannot split {len(values)} items into {k} non-empty partitions")
    heap: list[_State] = []
    for value, index in sorted((value, index) for index, value in enumerate(values)):
        heapq.heappush(heap, _State(index, value, k))
    while len(heap) > 1:
        first = heapq.heappop(heap)
        second = heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    parts = [sorted(index for index, _ in kk_set.members) for kk_set in heap[0].sets]
    # verl's checks of the result: no empty part, every index seen once
    if any(not part for part in parts) or {i for part in parts for i in part} != set(range(len(values))):
        raise ValueError(f"Karmarkar-Karp did not return {k} non-empty partitions of every item")
    return parts


def _workload(lengths: np.ndarray) -> np.ndarray:
    """verl's ``calculate_workload``: ``24576 * s + s**2``, in int64 as verl upcasts to."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return 24576 * lengths + lengths**2


def _groups(rank_lengths: Sequence[np.ndarray], g: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per rank: the tokens and the workload of each forced group, as Python lists (verl's form)."""
    tokens = [np.asarray(lengths, dtype=np.int64).reshape(-1, g).sum(axis=1).tolist() for lengths in rank_lengths]
    work = [_workload(lengths).reshape(-1, g).sum(axis=1).tolist() for lengths in rank_lengths]
    return tokens, work


def _start_count(tokens: Sequence[list[int]], cap: int, minimum: Optional[int], step: Optional[int]) -> int:
    """verl's first count: per rank ``min(groups, ceildiv(tokens, cap))`` raised to the minimum,
    MAX over ranks (the first all-reduce), rounded up to ``num_batches_divided_by``."""
    counts = [min(len(t), ceildiv(sum(t), cap)) for t in tokens]
    if minimum is not None:
        counts = [max(minimum, c) for c in counts]
    count = max(counts)
    return roundup_divisible(count, step) if step is not None else count


def _samples(group_parts: list[list[int]], g: int) -> list[list[int]]:
    if g == 1:
        return group_parts
    return [[i * g + j for i in part for j in range(g)] for part in group_parts]


@dataclass
class KKLoopResult:
    """What verl >= 0.9's strict loop does on every rank.

    Attributes:
        parts: per rank, the micro-batches (ascending sample indices), or None if it failed.
        passes: KK passes per rank (also the number of all-reduces after the first when ranks
            are synced).
        failed_at: the count at which some rank ran out of groups, None if it succeeded.
    """

    parts: Optional[list[list[list[int]]]]
    passes: int
    failed_at: Optional[int]


def strict_loop(
    tokens: Sequence[list[int]],
    work: Sequence[list[int]],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    partition: Partitioner = verl_karmarkar_karp,
) -> KKLoopResult:
    """verl >= 0.9's count and strict loop on every rank's forced groups, synced across ranks.

    ``tokens[r]`` and ``work[r]`` are rank ``r``'s group tokens and group workloads (Python
    lists, as verl holds them). The count starts at verl's (:func:`_start_count`); each step
    runs ``partition`` on every rank and stops when every part of every rank is within the cap
    (the MIN all-reduce), else adds ``num_batches_divided_by`` (or 1). Fails, as verl does,
    when the count exceeds the fewest groups of any rank.

    Complexity: one ``partition`` per rank per step.
    """
    g = force_group_size
    count = _start_count(tokens, max_token_len, min_num_micro_batch, num_batches_divided_by)
    fewest = min(len(t) for t in tokens)  # verl agrees on it with the constraints all-reduce
    step = num_batches_divided_by or 1
    passes = 0
    while True:
        if count > fewest:
            return KKLoopResult(parts=None, passes=passes, failed_at=count)
        passes += 1
        group_parts = [partition(w, count) for w in work]
        within = all(sum(t[i] for i in part) <= max_token_len for t, parts in zip(tokens, group_parts) for part in parts)
        if within:  # the MIN all-reduce of "within the cap"
            break
        count += step
    return KKLoopResult(parts=[_samples(parts, g) for parts in group_parts], passes=passes, failed_at=None)


def kk_loop_plans(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    partition: Partitioner = verl_karmarkar_karp,
) -> KKLoopResult:
    """Run verl >= 0.9's strict loop (:func:`strict_loop`) on every simulated rank's lengths.

    Each rank's lengths must already be valid (every forced group within the cap, divisible
    by ``force_group_size``), which the CLI checks first. ``partition`` is the KK to run
    (by default :func:`verl_karmarkar_karp`, verl's own work).

    Complexity: one KK pass per rank per step, O(n k log k) each; the number of steps is the
    point of the comparison.

    Examples:
        >>> result = kk_loop_plans([np.array([7] * 8)], 8)
        >>> len(result.parts[0]), result.passes  # starts at ceildiv(56, 8) = 7
        (8, 2)
    """
    tokens, work = _groups(rank_lengths, force_group_size)
    return strict_loop(
        tokens, work, max_token_len, force_group_size=force_group_size,
        num_batches_divided_by=num_batches_divided_by, min_num_micro_batch=min_num_micro_batch, partition=partition,
    )


@dataclass
class OnePassResult:
    """What verl <= 0.8 does on every rank: one KK pass at the ``ceildiv`` count.

    Attributes:
        parts: per rank, the micro-batches (ascending sample indices), or None if some rank has
            fewer groups than the agreed count (verl 0.8 asserts there).
        count: the agreed count.
        over_cap: micro-batches over ``max_token_len``, summed over ranks.
        largest: tokens of the largest micro-batch on any rank.
    """

    parts: Optional[list[list[list[int]]]]
    count: int
    over_cap: int
    largest: int


def one_pass(
    tokens: Sequence[list[int]],
    work: Sequence[list[int]],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    partition: Partitioner = verl_karmarkar_karp,
) -> OnePassResult:
    """verl <= 0.8 on every rank's forced groups: verl's count, one ``partition`` per rank.

    Complexity: one ``partition`` per rank.
    """
    g = force_group_size
    count = _start_count(tokens, max_token_len, min_num_micro_batch, num_batches_divided_by)
    if any(count > len(t) for t in tokens):
        return OnePassResult(parts=None, count=count, over_cap=0, largest=0)
    group_parts = [partition(w, count) for w in work]
    sums = [sum(t[i] for i in part) for t, parts in zip(tokens, group_parts) for part in parts]
    return OnePassResult(
        parts=[_samples(parts, g) for parts in group_parts], count=count,
        over_cap=sum(s > max_token_len for s in sums), largest=max(sums),
    )


def kk_one_pass_plans(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    partition: Partitioner = verl_karmarkar_karp,
) -> OnePassResult:
    """Run verl <= 0.8's count rule and single KK pass (:func:`one_pass`) on every simulated rank.

    Per rank the count is ``min(groups, ceildiv(tokens, max_token_len))``, raised to
    ``min_num_micro_batch``; ranks take the MAX, rounded up to ``num_batches_divided_by``; each
    rank then balances its groups' workloads into that many parts with ``partition`` (verl's
    KK, :func:`verl_karmarkar_karp` by default), whatever their tokens.

    Complexity: one KK pass per rank, O(n k log k) each.

    Examples:
        >>> result = kk_one_pass_plans([np.array([7] * 8)], 8)   # ceildiv(56, 8) = 7 parts
        >>> result.count, result.over_cap, result.largest
        (7, 1, 14)
    """
    tokens, work = _groups(rank_lengths, force_group_size)
    return one_pass(
        tokens, work, max_token_len, force_group_size=force_group_size,
        num_batches_divided_by=num_batches_divided_by, min_num_micro_batch=min_num_micro_batch, partition=partition,
    )
