"""A tiny exact bin-packing solver for small inputs, the yardstick of the count search tests."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence


def optimal_bin_count(lengths: Sequence[int], capacity: int) -> int:
    """Fewest bins of ``capacity`` that hold ``lengths`` (each ``<= capacity``), by exhaustive
    search over subsets: the bin of the lowest remaining item is every fitting subset holding
    it. O(3^n); meant for n <= 10."""
    n = len(lengths)
    sums = [0] * (1 << n)
    for mask in range(1, 1 << n):
        low = mask & -mask
        sums[mask] = sums[mask ^ low] + lengths[low.bit_length() - 1]

    @lru_cache(maxsize=None)
    def best(mask: int) -> int:
        if not mask:
            return 0
        low = mask & -mask
        rest = mask ^ low
        result = n + 1
        sub = rest
        while True:  # every subset of the rest, joined with the lowest item
            if sums[sub | low] <= capacity:
                result = min(result, 1 + best(rest ^ sub))
            if not sub:
                break
            sub = (sub - 1) & rest
        return result

    return best((1 << n) - 1)
