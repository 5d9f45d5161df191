"""The balance at a chosen count: ``k`` cap-respecting parts of even workload.

Once the count is decided, the partition is balanced once: KK on workloads where parts hold
enough items for it to pay (it balances best), kept as it is if it respects the cap, else
repaired; the cap-aware greedy where the count is tight; and, last, a known feasible partition
split up to ``k``. That last fallback is what makes :func:`capped_balanced_partitions` succeed
at every count from a known partition's up to the number of items: the monotonicity the count
search and the data-parallel agreement rely on. Every result but an item-level KK within the
cap is then rebalanced by moves and swaps that never break it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..validation import IntSequence, as_int_array, check_capacity, int_argument
from .bins import _sums
from .feasibility import _fit_in, _Try
from .greedy import _capped_greedy
from .kk import CHUNKED_KK_MIN_ITEMS, _balanced_parts
from .local_search import _rebalance, _repair
from .packing import split_bins_to_count

# Tuning: which balance runs at which count, and how far the polish goes.

#: KK on workloads is run only when parts hold at least this many items on average (trades
#: KK's better balance against its O(n k) merges at tight counts): there it
#: balances best and its merges stay cheap. With fewer items per part (long responses, a few
#: per micro-batch) its merges of many-part states make a pass O(n k), and the count is tight
#: anyway, so the cap-aware greedy below balances at O(n log k).
SLACK_ITEMS_PER_PART = 6
#: ... and at counts up to this, where a pass costs O(n log n + n SMALL_COUNT) whatever the slack.
SMALL_COUNT = 64
#: A chunked KK within the cap is polished by the rebalance down to this fraction above the
#: lower bound (trades about k rebalance steps for item-level KK's balance; the rebalance's own
#: default is 0.1%, where the last steps of a long rebalance gain hundredths of a percent each): item-level KK gets within about 0.001% on slack inputs,
#: the chunked one within 0.2% (real_qwen_rollouts, 1024 samples, cap 32768), and the polish
#: closes that gap in about as many steps as there are parts.
CHUNKED_KK_POLISH = 0.00001


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
    size = as_int_array(tokens, "tokens", negative=False)
    work = as_int_array(workloads, "workloads", negative=False)
    capacity = check_capacity(capacity)
    k = int_argument("k", k, expected="a positive int (the number of parts)")
    n = len(size)
    if k > n:
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
    polish: float = CHUNKED_KK_POLISH,
    checked: bool = False,
) -> Optional[list[list[int]]]:
    """The body of :func:`capped_balanced_partitions` on validated arrays. ``polish``: where the
    chunked KK fits the cap, how close to the bound its rebalance goes (see
    :data:`CHUNKED_KK_POLISH`; a dataset's chunks pass the rebalance's own 0.1%). ``found_by`` is the
    count search's try that made ``feasible`` at exactly ``k`` parts, if one did. When that try
    started from a workload balance (LPT), its partition replaces, on inputs of
    :data:`CHUNKED_KK_MIN_ITEMS` items or more, the repair of the balanced KK where the KK
    breaks the cap (a repair costs up to a few best-fit-decreasing passes, and the search
    already paid for one at this count); and if the LPT start itself broke the cap, the KK
    (balanced on workloads too) is not tried at all. On smaller inputs it is the fallback if
    the KK's repair fails. ``checked``: ``feasible`` is the search's own partition (not a
    caller's), so where it already has ``k`` parts it is taken as it is, without the split's
    check of the partition (at 512 items that check alone cost about half a
    best-fit-decreasing pass)."""
    n = len(size)
    candidate = None
    balanced_start = feasible if found_by is not None and found_by.on_work else None
    reuse = balanced_start is not None and n >= CHUNKED_KK_MIN_ITEMS
    if _has_slack(n, k):
        parts = None if reuse and found_by.repaired else _balanced_parts(work, k)
        if parts is not None and max(_sums(size, parts), default=0) <= capacity:
            if n < CHUNKED_KK_MIN_ITEMS:
                return parts  # item-level KK
            return _rebalance(parts, size, work, capacity, close_enough=polish)
        # The rebalance below copies the parts, so the search's partition is handed on as it is.
        candidate = balanced_start if reuse else _repair(parts, size, capacity, None)[0] or balanced_start
    if candidate is None:
        candidate = _capped_greedy(size, work, capacity, k)
    if candidate is None and feasible is not None and len(feasible) <= k:
        if checked and len(feasible) == k:  # what the split returns at its own count
            candidate = [sorted(part) for part in feasible]
        else:
            candidate = split_bins_to_count(feasible, size, k, weights=work)
    if candidate is None and feasible is None:  # no fallback: try hard (callers probing a count)
        candidate = _fit_in(size, work, capacity, k, thorough=True).parts
    if candidate is None:
        return None
    return _rebalance(candidate, size, work, capacity)
