"""The padded cost of micro-batches trimmed to their padding window (``trim_padding=True``).

A trimmed micro-batch keeps the columns from its earliest first token to its latest last token,
so a padded forward holds ``samples x window``, where the window is the union of its samples'
windows. With one-sided padding that is ``samples x longest``, the padded cost; with both sides
padded (left-padded prompts, right-padded responses) or with holes in the masks it can be much
wider than the longest sample, and a part that fits under ``samples x longest`` can break the cap.

So the planner runs the padded partitioner on each group's own window width (a lower bound of
any part's window) and then checks every part's real window: a part over the cap is cut, in
the order of its groups' first columns, into the fewest consecutive pieces that fit. Cutting a
part never widens a window nor adds samples, so every piece fits, every group fits alone (it
was checked), and a feasible partition splits into a feasible one at every larger count up to
the number of groups: the monotonicity the data-parallel agreement relies on. The count is not
always the least (the problem is two-dimensional); the cap is exact.

Pure NumPy: windows are ``[start, stop)`` column ranges per group, an empty group being
``(width, 0)`` (it widens no window).
"""

from __future__ import annotations

import heapq
from typing import Optional, Sequence

import numpy as np

__all__: list[str] = []


def window_cost(part: Sequence[int], starts: np.ndarray, stops: np.ndarray, group_size: int, round_to: int) -> int:
    """``samples x window`` of a part of groups, the window rounded up to ``round_to``. O(len)."""
    width = max(0, int(stops[part].max()) - int(starts[part].min()))
    return len(part) * group_size * (-(-width // round_to) * round_to)


def fit_to_cap(
    parts: Sequence[Sequence[int]],
    starts: np.ndarray,
    stops: np.ndarray,
    group_size: int,
    round_to: int,
    capacity: int,
) -> list[list[int]]:
    """Every part over ``capacity`` cut into consecutive pieces (by first column) that fit.

    Each group must fit alone. O(n log n).
    """
    out: list[list[int]] = []
    for part in parts:
        if window_cost(part, starts, stops, group_size, round_to) <= capacity:
            out.append(sorted(part))
            continue
        piece: list[int] = []
        low, high = 0, 0
        for group in sorted(part, key=lambda g: (int(starts[g]), int(stops[g]), g)):
            new_low = min(low, int(starts[group])) if piece else int(starts[group])
            new_high = max(high, int(stops[group])) if piece else int(stops[group])
            width = -(-max(0, new_high - new_low) // round_to) * round_to
            if piece and (len(piece) + 1) * group_size * width > capacity:
                out.append(sorted(piece))
                piece, new_low, new_high = [], int(starts[group]), int(stops[group])
            piece.append(group)
            low, high = new_low, new_high
        out.append(sorted(piece))
    return out


def split_to_count(
    parts: Sequence[Sequence[int]],
    starts: np.ndarray,
    stops: np.ndarray,
    group_size: int,
    round_to: int,
    count: int,
) -> Optional[list[list[int]]]:
    """``parts`` split, costliest first, into exactly ``count`` parts; None if there are more
    parts already or fewer groups than ``count``. Never raises a part's cost. O(count log count)."""
    total = sum(len(part) for part in parts)
    if len(parts) > count or count > total:
        return None
    heap = [(-window_cost(p, starts, stops, group_size, round_to), sorted(p)) for p in parts]
    heapq.heapify(heap)
    done: list[list[int]] = []
    while len(heap) + len(done) < count:
        _, part = heapq.heappop(heap)
        if len(part) < 2:
            done.append(part)
            continue
        ordered = sorted(part, key=lambda g: (int(starts[g]), int(stops[g]), g))
        half = len(ordered) // 2
        for piece in (sorted(ordered[:half]), sorted(ordered[half:])):
            heapq.heappush(heap, (-window_cost(piece, starts, stops, group_size, round_to), piece))
    return [part for _, part in sorted(heap)] + done
