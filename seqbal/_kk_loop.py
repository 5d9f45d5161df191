"""verl's own micro-batching, kept only as the baselines that ``seqbal plan`` compares with.

Two versions are in use, and users run both:

* verl <= 0.8 (:func:`kk_one_pass_plans`): one KK pass at ``ceildiv(total_tokens, max_token_len)``
  (at most the batch size, at least ``min_num_micro_batch``, MAX over ranks, rounded up to
  ``num_batches_divided_by``). The cap is a target, not a limit: parts can exceed it.
* verl >= 0.9 (:func:`kk_loop_plans`, the strict ``within_limit`` loop of verl PR #7553): start
  at the same count, run Karmarkar-Karp (KK) on the quadratic workloads, and while any part is
  over the cap add ``num_batches_divided_by`` (or 1) micro-batches and run KK again. With
  data-parallel ranks every step is one all-reduce (MIN of "within the cap"), so the number of
  steps is also the number of collectives.

Balancing workload instead of tokens is what makes both overshoot: KK puts one long sequence
with many short ones, and the token sums spread out, so the one pass exceeds the cap and the
loop stops well above the packing optimum.

Neither is used by the library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .partition import ceildiv, karmarkar_karp, roundup_divisible
from .workload import calculate_workload

__all__ = ["KKLoopResult", "kk_loop_plans", "OnePassResult", "kk_one_pass_plans"]


@dataclass
class KKLoopResult:
    """What the older loop does on every rank.

    Attributes:
        parts: per rank, the micro-batches (ascending sample indices), or None if it failed.
        passes: KK passes per rank (also the number of all-reduces when ranks are synced).
        failed_at: the count at which some rank ran out of groups, None if it succeeded.
    """

    parts: Optional[list[list[list[int]]]]
    passes: int
    failed_at: Optional[int]


def kk_loop_plans(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
) -> KKLoopResult:
    """Run the older loop on every simulated rank, with the count agreed (MAX) across ranks.

    Each rank's lengths must already be valid (every forced group within the cap, divisible
    by ``force_group_size``), which ``plan_micro_batches`` checks first in the CLI.

    Complexity: one KK pass per rank per step; the number of steps is the point of the comparison.

    Examples:
        >>> result = kk_loop_plans([np.array([7] * 8)], 8)
        >>> len(result.parts[0]), result.passes  # starts at ceildiv(56, 8) = 7
        (8, 2)
    """
    g = force_group_size
    step = num_batches_divided_by or 1
    tokens = [np.asarray(lengths, dtype=np.int64).reshape(-1, g).sum(axis=1) for lengths in rank_lengths]
    work = [calculate_workload(np.asarray(lengths, dtype=np.int64)).reshape(-1, g).sum(axis=1) for lengths in rank_lengths]
    count = max(ceildiv(int(t.sum()), max_token_len) for t in tokens)
    count = roundup_divisible(max(count, min_num_micro_batch or 1, 1), step)
    passes = 0
    while True:
        if any(count > len(t) for t in tokens):
            return KKLoopResult(parts=None, passes=passes, failed_at=count)
        passes += 1
        group_parts = [karmarkar_karp(w, count, equal_size=False) for w in work]
        if all(int(t[p].sum()) <= max_token_len for t, parts in zip(tokens, group_parts) for p in parts):
            break
        count += step
    samples = [[sorted(i * g + j for i in part for j in range(g)) for part in parts] for parts in group_parts]
    return KKLoopResult(parts=samples, passes=passes, failed_at=None)


@dataclass
class OnePassResult:
    """What verl <= 0.8 does on every rank: one KK pass at the ``ceildiv`` count.

    Attributes:
        parts: per rank, the micro-batches (ascending sample indices), or None if some rank has
            fewer groups than the agreed count (verl's KK would fail there).
        count: the agreed count.
        over_cap: micro-batches over ``max_token_len``, summed over ranks.
        largest: tokens of the largest micro-batch on any rank.
    """

    parts: Optional[list[list[list[int]]]]
    count: int
    over_cap: int
    largest: int


def kk_one_pass_plans(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
) -> OnePassResult:
    """Run verl <= 0.8's count rule and single KK pass on every simulated rank.

    Per rank the count is ``min(groups, ceildiv(tokens, max_token_len))``, raised to
    ``min_num_micro_batch``; ranks take the MAX, rounded up to ``num_batches_divided_by``; each
    rank then balances its groups' workloads into that many parts with KK, whatever their tokens.

    Complexity: one KK pass per rank.

    Examples:
        >>> result = kk_one_pass_plans([np.array([7] * 8)], 8)   # ceildiv(56, 8) = 7 parts
        >>> result.count, result.over_cap, result.largest
        (7, 1, 14)
    """
    g = force_group_size
    tokens = [np.asarray(lengths, dtype=np.int64).reshape(-1, g).sum(axis=1) for lengths in rank_lengths]
    work = [calculate_workload(np.asarray(lengths, dtype=np.int64)).reshape(-1, g).sum(axis=1) for lengths in rank_lengths]
    counts = [max(min(len(t), ceildiv(int(t.sum()), max_token_len)), min_num_micro_batch or 1, 1) for t in tokens]
    count = roundup_divisible(max(counts), num_batches_divided_by or 1)
    if any(count > len(t) for t in tokens):
        return OnePassResult(parts=None, count=count, over_cap=0, largest=0)
    group_parts = [karmarkar_karp(w, count, equal_size=False) for w in work]
    sums = [int(t[p].sum()) for t, parts in zip(tokens, group_parts) for p in parts]
    samples = [[sorted(i * g + j for i in part for j in range(g)) for part in parts] for parts in group_parts]
    return OnePassResult(
        parts=samples, count=count, over_cap=sum(s > max_token_len for s in sums), largest=max(sums)
    )
