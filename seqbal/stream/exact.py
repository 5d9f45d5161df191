"""Choose exactly ``S`` samples of whole groups, oldest first.

A trainer with a fixed sample count per step (``samples_per_step``) must take whole groups
(GRPO's responses of one prompt share an advantage baseline) whose sizes add up to exactly
``S``. Oldest first: the groups are taken in arrival order, a group that would overshoot is
skipped. When that greedy ends short of ``S`` (mixed group sizes), the lexicographically oldest
exact subset is found with a subset-sum over bit sets (Python ints as bit sets, one shift and
an OR per group): suffix reachability from the youngest group back, then a forward pass that
takes each group whenever the rest can still be completed exactly. Cost: O(p) for the greedy,
and O(p * S / 64) word operations for the exact search (p groups), run only when the greedy
misses.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def exact_selection(samples: np.ndarray, target: int, *, exact: bool = True) -> Optional[list[int]]:
    """Positions of the groups (in arrival order) that make up exactly ``target`` samples.

    Args:
        samples: each group's number of samples, in arrival order, each in ``1..target``.
        target: the number of samples to take.
        exact: if True, None when no subset adds up to exactly ``target``; if False, the oldest
            first greedy is returned even when it falls short (a flush).

    Returns:
        Ascending group positions, or None.

    >>> exact_selection(np.array([3, 3, 2, 4]), 8)
    [0, 1, 2]
    >>> exact_selection(np.array([3, 4, 3, 2]), 8)  # 3 + 4 leaves 1: the oldest exact subset skips 4
    [0, 2, 3]
    >>> exact_selection(np.array([3, 4, 3, 3]), 6)
    [0, 2]
    >>> exact_selection(np.array([4, 4]), 6) is None
    True
    """
    sizes = np.asarray(samples, dtype=np.int64)
    totals = np.cumsum(sizes)
    hit = int(np.searchsorted(totals, target, side="left"))
    if hit < len(totals) and int(totals[hit]) == target:  # a prefix: the common case (equal groups)
        return list(range(hit + 1))
    chosen, total = [], 0
    for g, size in enumerate(sizes.tolist()):
        if total + size <= target:
            chosen.append(g)
            total += size
            if total == target:
                return chosen
    available = int(totals[-1]) if len(totals) else 0
    if available < target:
        return None if exact else chosen
    # The greedy missed: the oldest exact subset, if any.
    mask = (1 << (target + 1)) - 1
    reach = [0] * (len(sizes) + 1)
    reach[-1] = 1  # the empty suffix reaches 0
    size_list = sizes.tolist()
    for g in range(len(sizes) - 1, -1, -1):
        reach[g] = (reach[g + 1] | (reach[g + 1] << size_list[g])) & mask
    if not (reach[0] >> target) & 1:
        return None if exact else chosen
    picked, left = [], target
    for g, size in enumerate(size_list):
        if left == 0:
            break
        if size <= left and (reach[g + 1] >> (left - size)) & 1:
            picked.append(g)
            left -= size
    return picked
