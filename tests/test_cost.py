"""Cost models: the model's arithmetic, and the padded partitioner against an exact optimum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbal.cost import CostModel, as_cost_model, padded_min_count, padded_partitions


def _set_partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _set_partitions(rest):
        for i in range(len(partition)):
            yield partition[:i] + [[first] + partition[i]] + partition[i + 1:]
        yield [[first]] + partition


def _padded_cost(longest: list[int], group_size: int, part: list[int]) -> int:
    return len(part) * group_size * max(longest[i] for i in part)


@pytest.mark.parametrize(
    ("model", "lengths", "expected"),
    [
        (CostModel(), [5, 3], 8),
        (CostModel(round_to=4), [5, 3], 12),
        (CostModel(pack_round_to=16), [5, 3], 16),
        (CostModel(round_to=4, pack_round_to=8), [5, 3], 16),
        (CostModel(padded=True), [5, 3, 1], 15),
        (CostModel(padded=True, round_to=8), [5, 3, 1], 24),
        (CostModel(padded=True), [], 0),
    ],
)
def test_cost_of_one_micro_batch(model: CostModel, lengths: list[int], expected: int) -> None:
    assert model.cost(lengths) == expected


def test_token_capacity_is_the_largest_packed_total_within_the_cap() -> None:
    model = CostModel(pack_round_to=8)
    assert model.token_capacity(100) == 96
    for total in range(0, 120):
        assert (model.cost([total]) <= 100) == (total <= model.token_capacity(100))


@pytest.mark.parametrize(
    "kwargs",
    [{"round_to": 0}, {"round_to": 2.5}, {"pack_round_to": -1}, {"padded": "yes"}, {"padded": True, "pack_round_to": 4},
     {"round_to": True}],
)
def test_invalid_models_are_value_errors(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        CostModel(**kwargs)


def test_names_and_errors() -> None:
    assert as_cost_model(None) == as_cost_model("tokens") == CostModel()
    assert as_cost_model("padded") == CostModel(padded=True)
    model = CostModel(round_to=8)
    assert as_cost_model(model) is model
    with pytest.raises(ValueError, match="cost_model must be 'tokens', 'padded'"):
        as_cost_model("pad")
    assert str(CostModel()) == "token cost (effective tokens)"
    assert "multiple of 4" in str(CostModel(pack_round_to=4))


def test_numpy_scalars_are_accepted_as_python_ints() -> None:
    model = CostModel(padded=np.bool_(True), round_to=np.int32(8))
    assert model == CostModel(padded=True, round_to=8) and type(model.round_to) is int


@settings(max_examples=300, deadline=None)
@given(
    longest=st.lists(st.integers(0, 30), min_size=1, max_size=7),
    group_size=st.integers(1, 3),
    slack=st.integers(0, 60),
)
def test_padded_count_is_the_exact_optimum_and_monotone(longest: list[int], group_size: int, slack: int) -> None:
    capacity = group_size * max(max(longest), 1) + slack
    n = len(longest)
    optimum = min(
        len(p) for p in _set_partitions(list(range(n)))
        if all(_padded_cost(longest, group_size, part) <= capacity for part in p)
    )
    found = padded_min_count(longest, group_size, capacity)
    assert found == optimum
    if found > 1:
        assert padded_partitions(longest, group_size, capacity, found - 1) is None
    for k in range(found, n + 1):  # feasible at the optimum stays feasible up to n parts
        parts = padded_partitions(longest, group_size, capacity, k)
        assert parts is not None and len(parts) == k
        assert sorted(i for part in parts for i in part) == list(range(n))
        assert all(part == sorted(part) and part for part in parts)
        assert all(_padded_cost(longest, group_size, part) <= capacity for part in parts)


def test_padded_balance_beats_the_greedy_fill_on_an_uneven_batch() -> None:
    # 8 long samples and 56 short ones at a count well above the minimum: balancing the padded
    # workload must spread the long samples instead of filling runs to the cap.
    longest = [2000] * 8 + [100] * 56
    capacity = 4096
    k = 16
    parts = padded_partitions(longest, 1, capacity, k)
    work = [len(p) * (24576 * max(longest[i] for i in p) + max(longest[i] for i in p) ** 2) for p in parts]
    assert max(work) == 1 * (24576 * 2000 + 2000 ** 2)  # every long sample alone: the best possible
    assert padded_min_count(longest, 1, capacity) == 6  # 4 runs of 2 long, 2 runs of 40 and 16 short


def test_a_group_over_the_cap_is_reported() -> None:
    with pytest.raises(ValueError, match="costs 40 > capacity 30"):
        padded_min_count([10, 20], 2, 30)
    assert padded_partitions([10, 20], 2, 30, 2) is None


def test_deterministic() -> None:
    rng = np.random.default_rng(5)
    longest = rng.integers(1, 3000, 500).tolist()
    first = padded_partitions(longest, 1, 8192, 200)
    assert first == padded_partitions(list(longest), 1, 8192, 200)
