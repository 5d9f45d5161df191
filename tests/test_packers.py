"""Cap-safe packers: first_fit_partitions, best_fit_decreasing_partitions, split_bins_to_count,
and the reserving fill (same bins as its item-by-item reference, kept below).

Property tests replay each packer's rule on its own output (so they check the documented
behaviour, not only validity) and compare counts with an exact optimum on small inputs.
"""

from __future__ import annotations

import bisect
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbal.partition import (
    best_fit_decreasing_partitions,
    first_fit_partitions,
    packing_lower_bound,
    split_bins_to_count,
)
from seqbal.partition.packing import _reserving_fill_partitions

SETTINGS = settings(max_examples=150, deadline=None)


def assert_valid_packing(lengths, bins, capacity):
    """Every item exactly once, bins non-empty, ascending, within the capacity."""
    lengths = np.asarray(lengths, dtype=np.int64)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for position, b in enumerate(bins):
        assert b, f"bin {position} is empty"
        assert list(b) == sorted(b), f"bin {position} not ascending"
        assert int(lengths[list(b)].sum()) <= capacity, f"bin {position} over capacity"


def processing_order(lengths, decreasing):
    n = len(lengths)
    if not decreasing:
        return list(range(n))
    return sorted(range(n), key=lambda i: (-lengths[i], i))


def replay(lengths, bins, capacity, order, choose):
    """Re-run a packing rule on ``order`` against ``bins`` (in opening order): each item must sit
    in the bin ``choose(loads, size)`` picks at its turn, or open the next bin if it picks none."""
    home = {i: b for b, members in enumerate(bins) for i in members}
    loads: list[int] = []
    for item in order:
        size = lengths[item]
        expected = choose(loads, size, capacity)
        if expected is None:
            assert home[item] == len(loads), f"item {item} should open bin {len(loads)}, is in {home[item]}"
            loads.append(size)
        else:
            assert home[item] == expected, f"item {item} should go to bin {expected}, is in {home[item]}"
            loads[expected] += size


def first_fit_choice(loads, size, capacity):
    return next((b for b, load in enumerate(loads) if load + size <= capacity), None)


def best_fit_choice(loads, size, capacity):
    fits = [(capacity - load, b) for b, load in enumerate(loads) if load + size <= capacity]
    return min(fits)[1] if fits else None


def optimum(lengths, capacity):
    """Exact minimum number of bins (exhaustive over subsets; small inputs only)."""
    n = len(lengths)
    full = (1 << n) - 1
    fits = [sum(lengths[i] for i in range(n) if mask >> i & 1) <= capacity for mask in range(full + 1)]

    @lru_cache(maxsize=None)
    def solve(remaining):
        if remaining == 0:
            return 0
        low = remaining & -remaining  # the lowest remaining item must go somewhere: put it first
        best = n
        rest = remaining ^ low
        sub = rest
        while True:
            if fits[sub | low]:
                best = min(best, 1 + solve(rest ^ sub))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        return best

    return solve(full)


# ---------------------------------------------------------------------------------------------
# Documented examples
# ---------------------------------------------------------------------------------------------


def test_first_fit_examples():
    assert first_fit_partitions([6, 5, 4, 3], 10) == [[0, 2], [1, 3]]
    # Input order opens a bin for 4 that decreasing order avoids.
    assert first_fit_partitions([3, 8, 5, 4], 10) == [[0, 2], [1], [3]]
    assert first_fit_partitions([3, 8, 5, 4], 10, decreasing=True) == [[1], [2, 3], [0]]
    assert first_fit_partitions([], 10) == []


def test_best_fit_decreasing_beats_first_fit_decreasing():
    # After 80 | 48+35: FFD puts 15 with 80 (first with room), and the two 9s no longer fit
    # together anywhere; BFD puts 15 with 48+35 (fullest with room), leaving 20 next to 80.
    lengths = [15, 9, 80, 9, 48, 35]
    assert first_fit_partitions(lengths, 100, decreasing=True) == [[0, 2], [1, 4, 5], [3]]
    assert best_fit_decreasing_partitions(lengths, 100) == [[1, 2, 3], [0, 4, 5]]
    assert best_fit_decreasing_partitions([5, 4, 3, 3, 2, 2, 1], 10) == [[0, 1, 6], [2, 3, 4, 5]]


@pytest.mark.parametrize("packer", [first_fit_partitions, best_fit_decreasing_partitions])
def test_packers_reject_bad_input(packer):
    with pytest.raises(ValueError, match=r"item 1 has 11 tokens and exceeds capacity 10"):
        packer([3, 11, 2], 10)
    with pytest.raises(ValueError, match=r"item 0 is negative"):
        packer([-1, 2], 10)
    with pytest.raises(ValueError, match=r"capacity must be positive"):
        packer([1, 2], 0)


def test_split_examples():
    assert split_bins_to_count([[0, 1, 2]], [3, 2, 1], 2) == [[0], [1, 2]]
    # The heaviest multi-item bin is split first; single-item bins are never touched.
    assert split_bins_to_count([[0], [1, 2], [3, 4, 5]], [9, 4, 4, 1, 1, 1], 3) == [[0], [1, 2], [3, 4, 5]]
    assert split_bins_to_count([[0], [1, 2], [3, 4, 5]], [9, 4, 4, 1, 1, 1], 4) == [[0], [1], [3, 4, 5], [2]]
    # weights choose the bin and the halves; tokens are not consulted.
    assert split_bins_to_count([[0, 1], [2, 3]], [1, 1, 1, 1], 3, weights=[1, 1, 5, 5]) == [[0, 1], [2], [3]]


def test_split_errors():
    with pytest.raises(ValueError, match=r"cannot split 2 bins down to 1"):
        split_bins_to_count([[0], [1]], [1, 1], 1)
    with pytest.raises(ValueError, match=r"cannot make 4 non-empty bins from 3 items"):
        split_bins_to_count([[0, 1, 2]], [1, 1, 1], 4)


# ---------------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------------

capacities = st.integers(1, 60)


@st.composite
def items_under(draw, max_size=40):
    capacity = draw(capacities)
    lengths = draw(st.lists(st.integers(0, capacity), max_size=max_size))
    return lengths, capacity


@SETTINGS
@given(items_under(), st.booleans())
def test_property_first_fit(case, decreasing):
    lengths, capacity = case
    bins = first_fit_partitions(lengths, capacity, decreasing=decreasing)
    assert_valid_packing(lengths, bins, capacity)
    replay(lengths, bins, capacity, processing_order(lengths, decreasing), first_fit_choice)
    loads = sorted(sum(lengths[i] for i in b) for b in bins)
    if len(loads) >= 2:  # any-fit: no two bins could have been merged
        assert loads[0] + loads[1] > capacity
    assert len(bins) >= packing_lower_bound(lengths, capacity)


@SETTINGS
@given(items_under())
def test_property_best_fit_decreasing(case):
    lengths, capacity = case
    bins = best_fit_decreasing_partitions(lengths, capacity)
    assert_valid_packing(lengths, bins, capacity)
    replay(lengths, bins, capacity, processing_order(lengths, True), best_fit_choice)
    assert len(bins) >= packing_lower_bound(lengths, capacity)


@settings(max_examples=120, deadline=None)
@given(items_under(max_size=9))
def test_property_counts_against_the_optimum(case):
    lengths, capacity = case
    best = optimum(lengths, capacity)
    lower = packing_lower_bound(lengths, capacity)
    ffd = len(first_fit_partitions(lengths, capacity, decreasing=True))
    bfd = len(best_fit_decreasing_partitions(lengths, capacity))
    assert lower <= best <= min(ffd, bfd)
    # Dosa's tight bound for FFD, also proven for BFD: 11/9 OPT + 6/9.
    assert 9 * ffd <= 11 * best + 6 and 9 * bfd <= 11 * best + 6


@st.composite
def packings_and_targets(draw):
    lengths, capacity = draw(items_under())
    bins = first_fit_partitions(lengths, capacity, decreasing=draw(st.booleans()))
    target = draw(st.integers(len(bins), max(len(bins), len(lengths))))
    weights = draw(st.one_of(st.none(), st.lists(st.integers(0, 1000), min_size=len(lengths), max_size=len(lengths))))
    return lengths, capacity, bins, target, weights


@SETTINGS
@given(packings_and_targets())
def test_property_split_bins_to_count(case):
    lengths, capacity, bins, target, weights = case
    result = split_bins_to_count(bins, lengths, target, weights=weights)
    assert len(result) == target
    assert_valid_packing(lengths, result, capacity)
    # every new bin is part of an old one (so no cap the input met can break); old bins keep
    # their positions
    origin = {i: position for position, b in enumerate(bins) for i in b}
    for position, b in enumerate(result):
        sources = {origin[i] for i in b}
        assert len(sources) == 1
        if position < len(bins):
            assert sources == {position}
    assert split_bins_to_count(bins, lengths, target, weights=weights) == result


@SETTINGS
@given(st.lists(st.integers(0, 100), min_size=2, max_size=30))
def test_property_split_halves_are_balanced(weights):
    left, right = split_bins_to_count([list(range(len(weights)))], weights, 2)
    difference = abs(sum(weights[i] for i in left) - sum(weights[i] for i in right))
    assert difference <= max(weights)  # greedy LPT halves differ by at most one item


# ---------------------------------------------------------------------------------------------
# The reserving fill: the same bins as the item-by-item fill it replaced
# ---------------------------------------------------------------------------------------------


def reserving_fill_one_by_one(sizes, capacity):
    """The reserving fill as it was before it took runs of one size at once (seqbal 885d4bf):
    one union-find step per item over the positions of the sorted order. The reference."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    order = np.lexsort((np.arange(n), sizes))
    size_at = [-1] + sizes[order].tolist()
    item_at = [-1] + order.tolist()
    left_of = list(range(n + 1))

    def largest_left(position):
        while left_of[position] != position:
            left_of[position] = left_of[left_of[position]]
            position = left_of[position]
        return position

    def take(position):
        left_of[position] = position - 1
        return item_at[position]

    bins = []
    smallest = 1
    for _ in range(n):
        top = largest_left(n)
        if top == 0:
            break
        room = capacity - size_at[top]
        members = [take(top)]
        while True:
            while smallest <= n and left_of[smallest] != smallest:
                smallest += 1
            if smallest > n or size_at[smallest] > room:
                break
            position = largest_left(bisect.bisect_right(size_at, room - size_at[smallest]) - 1)
            last = position <= smallest
            if last:
                position = largest_left(bisect.bisect_right(size_at, room) - 1)
            room -= size_at[position]
            members.append(take(position))
            if last:
                break
        bins.append(sorted(members))
    return bins


@st.composite
def repeated_sizes(draw):
    """Items under a capacity drawn from a few distinct sizes (long runs of one size), zeros and
    the capacity itself included."""
    capacity = draw(st.integers(1, 400))
    distinct = draw(st.lists(st.integers(0, capacity), min_size=1, max_size=8))
    extremes = draw(st.lists(st.sampled_from([0, capacity, max(capacity // 2, 0), max(capacity // 3, 0)]), max_size=3))
    pool = distinct + extremes
    lengths = draw(st.lists(st.sampled_from(pool), max_size=120))
    return lengths, capacity


@settings(max_examples=400, deadline=None)
@given(st.one_of(items_under(), repeated_sizes()))
def test_property_reserving_fill_matches_one_by_one(case):
    lengths, capacity = case
    bins = _reserving_fill_partitions(np.asarray(lengths, dtype=np.int64), capacity)
    assert bins == reserving_fill_one_by_one(lengths, capacity)
    assert_valid_packing(lengths, bins, capacity)


@pytest.mark.parametrize("seed", range(6))
def test_reserving_fill_matches_one_by_one_at_scale(seed):
    """Thousands of items over hundreds of distinct lengths, as real lengths repeat."""
    rng = np.random.default_rng(seed)
    capacity = int(rng.choice([64, 1000, 4096, 32768]))
    n = int(rng.integers(1, 20000))
    if seed % 2:
        lengths = np.minimum(rng.lognormal(np.log(capacity / 12), 1.0, n).astype(np.int64), capacity)
    else:
        lengths = rng.choice(rng.integers(0, capacity + 1, int(rng.integers(1, 400))), n)
    bins = _reserving_fill_partitions(lengths, capacity)
    assert bins == reserving_fill_one_by_one(lengths, capacity)
    assert_valid_packing(lengths, bins, capacity)


def test_reserving_fill_edges():
    assert _reserving_fill_partitions(np.array([], dtype=np.int64), 5) == []
    assert _reserving_fill_partitions(np.array([3]), 3) == [[0]]
    assert _reserving_fill_partitions(np.array([0, 0, 0]), 1) == [[0, 1, 2]]
    assert _reserving_fill_partitions(np.array([5, 5, 5]), 5) == [[2], [1], [0]]
    huge = np.array([2**61, 1, 2**62, 2**61, 5], dtype=np.int64)  # sort keys past 2^63: the lexsort
    assert _reserving_fill_partitions(huge, 2**62) == reserving_fill_one_by_one(huge, 2**62)
    assert _reserving_fill_partitions(np.array([3, 1, 2], dtype=np.int32), 4) == reserving_fill_one_by_one([3, 1, 2], 4)
