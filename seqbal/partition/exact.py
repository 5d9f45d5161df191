"""A budgeted exact search for a cap-respecting partition of a few items into ``k`` parts.

The count search's tries are heuristics: on a few items packed tightly they can miss a count
that exists (``[39, 42, 39, 42, 36, 39, 44, 40, 41, 44, 35]`` fits in 4 parts of 118, which no
try finds). That costs most where the count is then rounded up to a multiple of
``num_batches_divided_by``: one missed count becomes a whole multiple more. For a few items a
depth-first search settles the question: items in decreasing order, each into a part with room
(parts of equal load are tried once), a part that is left empty never followed by another
empty one. It stops after :data:`NODE_BUDGET` placements, so its cost is bounded whatever the
input; ``None`` means "not found", not "impossible". The planner calls it only with
``num_batches_divided_by`` and at most :data:`MAX_ITEMS` groups.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

__all__: list[str] = []

#: Most items the search takes on (beyond that the heuristics are close enough and a search too dear).
MAX_ITEMS = 16
#: Most placements one search tries before it gives up.
NODE_BUDGET = 20_000


def exact_fit(tokens: Sequence[int], capacity: int, k: int) -> Optional[list[list[int]]]:
    """``k`` non-empty parts of ``tokens`` (item indices), each summing to at most ``capacity``,
    or None if none was found within the budget (or there are more than :data:`MAX_ITEMS` items,
    or fewer than ``k``). O(NODE_BUDGET * k) at most.

    >>> sorted(map(sorted, exact_fit([39, 42, 39, 42, 36, 39, 44, 40, 41, 44, 35], 118, 4)))
    [[0, 2, 5], [1, 8, 10], [3, 4, 7], [6, 9]]
    """
    sizes = [int(x) for x in np.asarray(tokens, dtype=np.int64)]
    n = len(sizes)
    if n > MAX_ITEMS or k < 1 or k > n or sum(sizes) > k * capacity or max(sizes, default=0) > capacity:
        return None
    order = sorted(range(n), key=lambda i: (-sizes[i], i))
    loads = [0] * k
    members: list[list[int]] = [[] for _ in range(k)]
    remaining = [0] * (n + 1)
    for position in range(n - 1, -1, -1):
        remaining[position] = remaining[position + 1] + sizes[order[position]]
    budget = [NODE_BUDGET]

    def place(position: int) -> bool:
        if n - position < sum(1 for part in members if not part):
            return False  # too few items left to fill every part
        if position == n:
            return True
        if remaining[position] > k * capacity - sum(loads):
            return False
        item, size = order[position], sizes[order[position]]
        tried: set[tuple[int, bool]] = set()
        for part in range(k):
            key = (loads[part], bool(members[part]))
            if key in tried or loads[part] + size > capacity:
                continue
            tried.add(key)
            budget[0] -= 1
            if budget[0] < 0:
                return False
            loads[part] += size
            members[part].append(item)
            if place(position + 1):
                return True
            loads[part] -= size
            members[part].pop()
        return False

    if not place(0):
        return None
    return [sorted(part) for part in members]
