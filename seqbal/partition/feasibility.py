"""One feasibility try: some partition into exactly ``k`` cap-respecting parts, or a verdict.

The count search runs the same try at every count it probes, so that "a partition into at most
``k`` parts is known" is monotone in ``k`` by construction. A try is cheap starts (LPT on
workloads, LPT on tokens) each repaired for a bounded number of steps: two starts because they
fail on different inputs (tokens evened out leave no room to repair into, workloads evened out
spread the tokens), bounded because a failing try must cost about a packing pass. A try also
says whether it *stalled* (its repairs fixed almost nothing), which tells the search to stop
stepping up one count at a time.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from .bins import PYTHON_SUMS_ITEMS, _sums
from .greedy import _greedy_balance
from .kk import _karmarkar_karp
from .local_search import _repair
from .parts import _descending, _part_sums

# Tuning: what one try may spend, and when it gives up on the counts next to it.

#: Repair steps a try may take per part over the cap (trades a count found against the cost of
#: a failing try): a feasible count is usually repaired in one or two steps per such part.
REPAIR_STEPS_PER_OVER = 3
#: A try *stalls* when every start's repair leaves more than this fraction of its over-cap parts
#: over (trades the one-by-one counts against probes wasted on counts that cannot work): in
#: practice its first steps find no move or swap for the worst part, the next counts then stall
#: too on every benchmark input, and the search goes on below the packing (see
#: :data:`seqbal.partition.search.LINEAR_TRIES`). A try that fixes even a few parts is not stalled: on
#: ``np.random.default_rng(91).integers(1160, 1570, 255)`` (cap 4096) the try at the bound
#: fixes 3 of 57 and the count three above it works.
STALLED_FRACTION = 0.99


class _Try(NamedTuple):
    """What one feasibility try at a count found."""

    parts: Optional[list[list[int]]]  #: a cap-respecting partition into the count, or None
    on_work: bool  #: ``parts`` came from a start balanced on workloads
    repaired: bool  #: ``parts`` needed a repair (the start broke the cap)
    stalled: bool  #: on failure, every start's repair left most of its over-cap parts over


def _fit_in(
    tokens: np.ndarray,
    work: np.ndarray,
    capacity: int,
    k: int,
    thorough: bool = False,
    orders: Optional[tuple[list[int], list[int]]] = None,
) -> _Try:
    """The feasibility try of the count search: some partition into ``k`` non-empty parts within
    ``capacity``, with the same methods at every count of one search.

    LPT on workloads, then LPT on tokens (largest first into the part with the smallest sum),
    each repaired by :func:`repair_over_capacity` with :data:`REPAIR_STEPS_PER_OVER` steps per
    part over the cap; the first that meets the cap wins. The two start points fail on
    different inputs (tokens evened out leave no room to repair into; workloads evened out
    spread the tokens). ``thorough`` (small searches, where every pass is cheap) adds KK on
    workloads and on tokens as start points and lifts the repair's step limit.
    O(n log k) plus the repair steps; O(n k) more when ``thorough``.
    """
    if k > len(tokens):
        return _Try(None, False, False, True)
    if orders is None:
        orders = (_descending(work), _descending(tokens))
    starts = [(lambda: _greedy_balance(work, k, orders[0]), True), (lambda: _greedy_balance(tokens, k, orders[1]), False)]
    if thorough:
        starts += [(lambda: _karmarkar_karp(work, k, equal_size=False), True),
                   (lambda: _karmarkar_karp(tokens, k, equal_size=False), False)]
    # Part sums in the interpreter on small inputs (see seqbal.partition.bins.PYTHON_SUMS_ITEMS).
    token_list = tokens.tolist() if len(tokens) <= PYTHON_SUMS_ITEMS else None
    stalled = True
    for start, on_work in starts:
        parts = start()
        if not all(parts):
            continue
        if token_list is not None:
            sums = _sums(tokens, parts, token_list)
            over = sum(total > capacity for total in sums)
        else:
            array = _part_sums(tokens, parts)
            over = int((array > capacity).sum())
        if not over:
            return _Try(parts, on_work, False, False)
        if token_list is None:
            sums = array.tolist()
        steps = None if thorough else REPAIR_STEPS_PER_OVER * over + 16
        repaired, left = _repair(parts, tokens, capacity, steps, sums)
        if repaired is not None:
            return _Try(repaired, on_work, True, False)
        stalled = stalled and left > STALLED_FRACTION * over
    return _Try(None, False, False, stalled)
