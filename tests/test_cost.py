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


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 4)), min_size=1, max_size=12),
    slack=st.integers(0, 100),
)
def test_padded_partitions_with_unequal_group_sizes_keep_the_cap(groups, slack) -> None:
    longest = [length for length, _ in groups]
    sizes = [size for _, size in groups]
    capacity = max(length * size for length, size in groups) + slack
    found = padded_min_count(longest, sizes, capacity)
    for k in range(found, len(groups) + 1):
        parts = padded_partitions(longest, sizes, capacity, k)
        assert parts is not None and len(parts) == k
        assert sorted(i for part in parts for i in part) == list(range(len(groups)))
        for part in parts:
            assert sum(sizes[i] for i in part) * max(longest[i] for i in part) <= capacity


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


# ---------------------------------------------------------------------------------------------
# Every planning entry point under every cost model
# ---------------------------------------------------------------------------------------------

from seqbal import plan_data_parallel, plan_micro_batches  # noqa: E402

from .invariants import assert_plan_invariants, micro_batch_cost  # noqa: E402

_MODELS = st.sampled_from(
    [None, "tokens", "padded", CostModel(round_to=8), CostModel(pack_round_to=16),
     CostModel(round_to=4, pack_round_to=8), CostModel(padded=True, round_to=8)]
)


def _fits(lengths: list[int], cap: int, model, group_size: int) -> bool:
    groups = [lengths[i:i + group_size] for i in range(0, len(lengths), group_size)]
    return all(micro_batch_cost(group, model) <= cap for group in groups)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    model=_MODELS,
    group_size=st.integers(1, 3),
    divisor=st.one_of(st.none(), st.integers(1, 3)),
    minimum=st.one_of(st.none(), st.integers(1, 6)),
)
def test_plan_keeps_every_guarantee_under_every_cost_model(data, model, group_size, divisor, minimum) -> None:
    groups = data.draw(st.integers(1, 12))
    lengths = data.draw(st.lists(st.integers(0, 300), min_size=groups * group_size, max_size=groups * group_size))
    cap = data.draw(st.integers(1, 1200))
    kwargs = dict(force_group_size=group_size, num_batches_divided_by=divisor, min_num_micro_batch=minimum,
                  cost_model=model)
    try:
        parts = plan_micro_batches(lengths, cap, **kwargs)
    except ValueError as error:
        message = str(error)
        if not _fits(lengths, cap, model, group_size):
            assert "exceeds max_token_len" in message
        else:
            assert message.startswith("Cannot satisfy max_token_len"), message
        return
    assert_plan_invariants(lengths, parts, cap, force_group_size=group_size, num_batches_divided_by=divisor,
                           min_num_micro_batch=minimum, cost_model=model)
    assert parts == plan_micro_batches(list(lengths), cap, **kwargs)  # deterministic


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=7), slack=st.integers(0, 80),
       round_to=st.sampled_from([1, 4]))
def test_padded_count_is_the_exact_optimum_through_plan_micro_batches(lengths, slack, round_to) -> None:
    model = CostModel(padded=True, round_to=round_to)
    cap = micro_batch_cost([max(lengths)], model) + slack
    optimum = min(
        len(p) for p in _set_partitions(list(range(len(lengths))))
        if all(micro_batch_cost([lengths[i] for i in part], model) <= cap for part in p)
    )
    assert len(plan_micro_batches(lengths, cap, cost_model=model)) == optimum


@settings(max_examples=60, deadline=None)
@given(data=st.data(), model=_MODELS, world=st.integers(1, 4))
def test_plan_data_parallel_agrees_under_every_cost_model(data, model, world) -> None:
    ranks = [data.draw(st.lists(st.integers(1, 200), min_size=4, max_size=20)) for _ in range(world)]
    cap = 1024
    plans = plan_data_parallel(ranks, cap, cost_model=model)
    assert len({len(parts) for parts in plans}) == 1
    for lengths, parts in zip(ranks, plans):
        assert_plan_invariants(lengths, parts, cap, cost_model=model)


def test_padded_plan_bounds_padded_memory_where_the_token_plan_does_not() -> None:
    # One long sample and many short ones: the token cost mixes them (balanced workload), so a
    # padded forward of such a micro-batch holds samples x longest, far over the cap.
    lengths = [3000] * 4 + [200] * 60
    cap = 4096
    token_plan = plan_micro_batches(lengths, cap)
    padded_plan = plan_micro_batches(lengths, cap, cost_model="padded")
    worst_token = max(micro_batch_cost([lengths[i] for i in p], "padded") for p in token_plan)
    assert worst_token > cap
    assert max(micro_batch_cost([lengths[i] for i in p], "padded") for p in padded_plan) <= cap
    assert len(padded_plan) == 4 + 3  # each long sample alone; 60 short ones, 20 per micro-batch


def test_errors_name_the_cost_model() -> None:
    with pytest.raises(ValueError, match=r"sample 0 has 9 tokens \(16 after rounding, under the token cost"):
        plan_micro_batches([9], 12, cost_model=CostModel(round_to=8))
    with pytest.raises(ValueError, match=r"forced group exceeds max_token_len: group 0 .* costing 14 under the padded"):
        plan_micro_batches([6, 7], 12, cost_model="padded", force_group_size=2)
    with pytest.raises(ValueError, match="Cannot satisfy max_token_len=12 under the padded cost"):
        plan_micro_batches([6, 6, 6], 12, cost_model="padded", min_num_micro_batch=4)
    with pytest.raises(ValueError, match="cost_model must be 'tokens', 'padded'"):
        plan_micro_batches([6, 7], 12, cost_model="pad")


def test_the_default_cost_model_changes_nothing() -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 4000, 300).tolist()
    expected = plan_micro_batches(lengths, 8192)
    assert plan_micro_batches(lengths, 8192, cost_model="tokens") == expected
    assert plan_micro_batches(lengths, 8192, cost_model=CostModel()) == expected


# ---------------------------------------------------------------------------------------------
# The driver-side schedule under every cost model
# ---------------------------------------------------------------------------------------------

from seqbal import build_dp_schedule  # noqa: E402

from .invariants import assert_schedule_invariants  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(data=st.data(), model=_MODELS, dp_size=st.integers(1, 3), group_size=st.integers(1, 2))
def test_build_dp_schedule_keeps_the_cap_under_every_cost_model(data, model, dp_size, group_size) -> None:
    groups = data.draw(st.integers(dp_size, 16))
    lengths = data.draw(st.lists(st.integers(1, 300), min_size=groups * group_size, max_size=groups * group_size))
    # Every group fits under every model: 2 x 300 rounded up to 8 costs 608 padded.
    cap = data.draw(st.integers(608, 2000))
    try:
        schedule = build_dp_schedule(lengths, dp_size, cap, force_group_size=group_size, cost_model=model)
    except ValueError as error:
        assert str(error).startswith("Cannot satisfy max_token_len"), error
        return
    assert_schedule_invariants(lengths, schedule, cap, dp_size, force_group_size=group_size, cost_model=model,
                               rebuild=lambda: build_dp_schedule(lengths, dp_size, cap, force_group_size=group_size,
                                                                 cost_model=model))


def test_padded_schedule_uses_the_exact_global_count_and_balances_ranks() -> None:
    rng = np.random.default_rng(11)
    lengths = rng.integers(100, 4000, 512).tolist()
    schedule = build_dp_schedule(lengths, 8, 16384, cost_model="padded")
    runs = padded_min_count(lengths, 1, 16384)
    assert schedule.num_micro_batches == -(-runs // 8)
    padded = CostModel(padded=True)
    assert all(padded.cost([lengths[i] for i in mb]) <= 16384 for rank in schedule.micro_batches for mb in rank)
    with pytest.raises(ValueError, match="sample 0 has 100 tokens under the padded cost"):
        build_dp_schedule([100, 1], 1, 99, cost_model="padded")


def test_padded_schedule_with_uid_groups_of_unequal_sizes_keeps_the_cap() -> None:
    # groups need not be contiguous nor equal: the longest of each group sets its padded cost
    lengths = [50, 400, 30, 30, 700, 10, 20, 600, 40, 90]
    group_ids = ["a", "b", "a", "c", "b", "c", "c", "d", "d", "a"]
    schedule = build_dp_schedule(lengths, 2, 1600, group_ids=group_ids, cost_model="padded")
    assert_schedule_invariants(lengths, schedule, 1600, 2, group_ids=group_ids, cost_model="padded")
    with pytest.raises(ValueError, match=r"group 1 \(samples \[1, 4\]\) costs 1400 under the padded cost"):
        build_dp_schedule(lengths, 2, 1300, group_ids=group_ids, cost_model="padded")
