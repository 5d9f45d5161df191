"""karmarkar_karp against a plain, slow Karmarkar-Karp with the same tie-breaks.

The item-level KK skips the heap for most merges (a state kept in hand, runs of single items);
its promise is that the result is the plain algorithm's, part for part, on every input, since
plans are hashed. The reference below is that plain algorithm, written densely: every state is
a list of ``k`` parts (empty ones included) and every state, single items too, goes through one
heap. Its tie-breaks are the documented ones: parts by descending (sum, size), equal parts in
the order of a stable sort of the dense merge (part i of the first state paired with part
k - 1 - i of the second); states by (largest spread, largest top sum, largest top size, oldest),
the single items numbered by ascending (value, index) before every merged state.
"""

from __future__ import annotations

import heapq

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbal.partition import karmarkar_karp


def plain_karmarkar_karp(values: list[int], k: int, equal_size: bool) -> list[list[int]]:
    """Dense largest differencing method: O(n k log k), for tests only."""
    n = len(values)
    if k == 1:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: (values[i], i))  # ascending value, index breaks ties
    empty = (0, 0, ())  # (sum, size, items)

    def state(parts: list[tuple[int, int, tuple[int, ...]]]) -> list[tuple[int, int, tuple[int, ...]]]:
        return sorted(parts, key=lambda part: (-part[0], -part[1]))  # stable: equal parts keep their order

    def key(parts: list[tuple[int, int, tuple[int, ...]]], node: int) -> tuple[int, int, int, int]:
        return (parts[-1][0] - parts[0][0], -parts[0][0], -parts[0][1], node)

    if equal_size:
        chunks = [order[offset:offset + k][::-1] for offset in range(0, n, k)]
        initial = [state([(values[i], 1, (i,)) for i in chunk]) for chunk in chunks]
    else:
        initial = [[(values[i], 1, (i,))] + [empty] * (k - 1) for i in order]
    states = dict(enumerate(initial))
    heap = [key(parts, node) for node, parts in states.items()]
    heapq.heapify(heap)
    next_node = len(states)
    while len(heap) > 1:
        first = states.pop(heapq.heappop(heap)[3])
        second = states.pop(heapq.heappop(heap)[3])
        dense = [
            (mine[0] + theirs[0], mine[1] + theirs[1], mine[2] + theirs[2])
            for mine, theirs in zip(first, reversed(second))
        ]
        states[next_node] = state(dense)
        heapq.heappush(heap, key(states[next_node], next_node))
        next_node += 1
    return [sorted(items) for _, _, items in states[heap[0][3]]]


def test_plain_reference_on_the_docstring_example() -> None:
    assert plain_karmarkar_karp([4, 5, 6, 7, 8], 2, False) == [[0, 1, 3], [2, 4]]
    assert plain_karmarkar_karp([4, 5, 6, 7, 8], 2, False) == karmarkar_karp([4, 5, 6, 7, 8], 2, False)


@st.composite
def kk_inputs(draw: st.DrawFn) -> tuple[list[int], int, bool]:
    n = draw(st.integers(1, 90))
    top = draw(st.sampled_from([1, 3, 10, 1000, 2**40]))  # small tops: many ties
    values = draw(st.lists(st.integers(0, top), min_size=n, max_size=n))
    k = draw(st.integers(1, n))
    equal_size = draw(st.booleans())
    if equal_size:
        k = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    return values, k, equal_size


@settings(max_examples=400)
@given(kk_inputs())
def test_karmarkar_karp_is_the_plain_algorithm(case: tuple[list[int], int, bool]) -> None:
    values, k, equal_size = case
    assert karmarkar_karp(values, k, equal_size) == plain_karmarkar_karp(values, k, equal_size)


def test_karmarkar_karp_is_the_plain_algorithm_on_long_runs() -> None:
    # Long LPT-like runs and long filling runs (k near n), heavy ties and heavy tails.
    rng = np.random.default_rng(7)
    for n, k in [(300, 2), (300, 7), (400, 40), (500, 250), (512, 61), (256, 255)]:
        for values in (rng.integers(0, 3, n), rng.integers(1, 10**6, n), (rng.pareto(1.0, n) * 50).astype(int)):
            listed = values.tolist()
            assert karmarkar_karp(listed, k, False) == plain_karmarkar_karp(listed, k, False)
