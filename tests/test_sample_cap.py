"""max_samples_per_micro_batch: the second hard cap, on samples per micro-batch (issue 29 point 5).

Property tests through every entry point (plan_micro_batches, rearrange_micro_batches,
plan_data_parallel, build_dp_schedule), checked by the one invariant checker; example tests of
its errors and of the pieces in seqbal.partition.sample_cap. The distributed cases are scenarios
of tests/distributed_workers.py; the CLI's is in tests/test_cli.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqbal import (
    CostModel,
    MicroBatchPlanError,
    build_dp_schedule,
    plan_data_parallel,
    plan_micro_batches,
    rearrange_micro_batches,
)
from seqbal.partition import sample_cap

from .invariants import assert_plan_invariants, assert_schedule_invariants, micro_batch_cost
from .test_rearrange import dense_batch

COST_MODELS = [None, "padded", CostModel(round_to=8), CostModel(pack_round_to=16)]


@st.composite
def capped_inputs(draw):
    """Lengths (a mix of short and long, so that both caps bind somewhere), a token cap, a
    sample cap, a forced group size dividing n, and sometimes a divisor or a minimum."""
    g = draw(st.sampled_from([1, 1, 2, 3]))
    groups = draw(st.integers(1, 60))
    short = st.integers(0, 40)
    long = st.integers(100, 500)  # within every cost model's capacity at the smallest cap
    lengths = draw(st.lists(st.one_of(short, short, long), min_size=groups * g, max_size=groups * g))
    cap = draw(st.integers(max(600 * g, 1), 4000))
    max_samples = draw(st.integers(g, 3 * g + 8))
    divisor = draw(st.sampled_from([None, None, 2, 3]))
    minimum = draw(st.sampled_from([None, None, 2, 5]))
    return lengths, cap, max_samples, g, divisor, minimum


def _plan_or_cannot(call):
    """The plan, or None where the count the caps need exceeds the groups (a documented error)."""
    try:
        return call()
    except MicroBatchPlanError as error:
        assert error.code == MicroBatchPlanError.CANNOT_SATISFY, error
        assert "Cannot satisfy max_token_len" in str(error), error  # "rank r: " first from plan_data_parallel
        return None


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capped_inputs(), st.sampled_from(COST_MODELS))
def test_plan_micro_batches_keeps_both_caps(case, cost_model):
    lengths, cap, max_samples, g, divisor, minimum = case
    kwargs = dict(force_group_size=g, num_batches_divided_by=divisor, min_num_micro_batch=minimum, cost_model=cost_model)
    parts = _plan_or_cannot(lambda: plan_micro_batches(lengths, cap, max_samples_per_micro_batch=max_samples, **kwargs))
    if parts is None:  # checked by _plan_or_cannot: the documented error, nothing else
        return
    assert_plan_invariants(lengths, parts, cap, max_samples_per_micro_batch=max_samples, **kwargs)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 50), min_size=1, max_size=80), st.integers(1, 9))
def test_sample_cap_alone_reaches_its_bound(lengths, max_samples):
    """Where tokens never bind, the count is exactly ceildiv(n, max_samples)."""
    parts = plan_micro_batches(lengths, 10**6, max_samples_per_micro_batch=max_samples)
    assert_plan_invariants(lengths, parts, 10**6, max_samples_per_micro_batch=max_samples)
    assert len(parts) == -(-len(lengths) // max_samples)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capped_inputs())
def test_rearrange_keeps_both_caps_and_equals_the_plan(case):
    lengths, cap, max_samples, g, divisor, minimum = case
    kwargs = dict(force_group_size=g, num_batches_divided_by=divisor, min_num_micro_batch=minimum,
                  max_samples_per_micro_batch=max_samples)
    expected = _plan_or_cannot(lambda: plan_micro_batches(lengths, cap, **kwargs))
    if expected is None:
        with pytest.raises(MicroBatchPlanError, match="Cannot satisfy"):
            rearrange_micro_batches(dense_batch(lengths), cap, **kwargs)
        return
    micro_batches, indices = rearrange_micro_batches(dense_batch(lengths), cap, **kwargs)
    assert indices == expected
    assert [mb.batch_size[0] for mb in micro_batches] == [len(part) for part in indices]
    assert_plan_invariants(lengths, indices, cap, force_group_size=g, num_batches_divided_by=divisor,
                           min_num_micro_batch=minimum, max_samples_per_micro_batch=max_samples)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(capped_inputs(), min_size=1, max_size=4), st.sampled_from([None, "padded"]))
def test_plan_data_parallel_keeps_both_caps_on_every_rank(cases, cost_model):
    _, cap, max_samples, g, divisor, minimum = cases[0]
    ranks = [lengths[: len(lengths) // g * g] or [1] * g for lengths, *_ in cases]
    kwargs = dict(force_group_size=g, num_batches_divided_by=divisor, min_num_micro_batch=minimum, cost_model=cost_model)
    plans = _plan_or_cannot(lambda: plan_data_parallel(ranks, cap, max_samples_per_micro_batch=max_samples, **kwargs))
    if plans is None:
        return
    assert len({len(parts) for parts in plans}) == 1
    own = [len(plan_micro_batches(lengths, cap, max_samples_per_micro_batch=max_samples, **kwargs)) for lengths in ranks]
    assert len(plans[0]) == max(own), "the agreed count is the largest any rank needs alone"
    for lengths, parts in zip(ranks, plans):
        assert_plan_invariants(lengths, parts, cap, max_samples_per_micro_batch=max_samples, **kwargs)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capped_inputs(), st.integers(1, 4), st.booleans(), st.sampled_from([None, "padded"]))
def test_build_dp_schedule_keeps_both_caps(case, dp_size, by_ids, cost_model):
    lengths, cap, max_samples, g, divisor, minimum = case
    group_kwargs = {"force_group_size": g}
    if by_ids:  # groups of unequal sizes: 1, 2, 3, 1, 2, 3, ... samples (all <= max_samples)
        sizes = [1 + i % min(3, max_samples) for i in range(len(lengths))]
        ids = [k for k, size in enumerate(sizes) for _ in range(size)][: len(lengths)]
        group_kwargs = {"group_ids": ids}
        members = [[i for i in range(len(ids)) if ids[i] == k] for k in set(ids)]
        if any(micro_batch_cost([lengths[i] for i in m], cost_model) > cap for m in members):
            return  # a group over the cap on its own: another error, tested elsewhere
    try:
        schedule = build_dp_schedule(lengths, dp_size, cap, num_batches_divided_by=divisor, min_num_micro_batch=minimum,
                                     max_samples_per_micro_batch=max_samples, cost_model=cost_model, **group_kwargs)
    except ValueError as error:
        assert "Cannot satisfy max_token_len" in str(error), error  # "rank r: " first from plan_data_parallel
        return
    assert_schedule_invariants(lengths, schedule, cap, dp_size, num_batches_divided_by=divisor, cost_model=cost_model,
                               min_num_micro_batch=minimum, max_samples_per_micro_batch=max_samples, **group_kwargs)


@pytest.mark.parametrize("max_samples", [1, 2, 3, 5])
def test_trimmed_padded_micro_batches_keep_the_sample_cap(max_samples):
    """trim_padding under the padded cost plans on windows, a route of its own."""
    lengths = np.random.default_rng(7).integers(1, 60, 24).tolist()
    kwargs = dict(cost_model="padded", trim_padding=True, max_samples_per_micro_batch=max_samples)
    micro_batches, indices = rearrange_micro_batches(dense_batch(lengths, seq_len=64), 240, **kwargs)
    assert_plan_invariants(lengths, indices, 240, cost_model="padded", max_samples_per_micro_batch=max_samples)
    plans = plan_data_parallel([lengths, lengths[::-1]], 240, cost_model="padded", max_samples_per_micro_batch=max_samples)
    for rank_lengths, parts in zip([lengths, lengths[::-1]], plans):
        assert_plan_invariants(rank_lengths, parts, 240, cost_model="padded", max_samples_per_micro_batch=max_samples)


def test_count_is_driven_by_the_sample_cap():
    assert len(plan_micro_batches([1] * 100, 10**6, max_samples_per_micro_batch=8)) == 13
    # a forced group of 3 counts 3: 2 groups per micro-batch of at most 7 samples
    assert len(plan_micro_batches([1] * 30, 10**6, force_group_size=3, max_samples_per_micro_batch=7)) == 5
    schedule = build_dp_schedule([1] * 100, 4, 10**6, max_samples_per_micro_batch=8)
    assert schedule.num_micro_batches == 4  # ceildiv(100, 8) = 13 micro-batches, rounded up to 16 on 4 ranks
    assert max(len(mb) for rank in schedule.micro_batches for mb in rank) <= 8


def test_tight_tokens_and_samples_keep_both_caps():
    """Token cap tight at its bound and a sample cap below what the token packing wants: the
    repair, the exchange and the fallbacks all run; both caps hold."""
    lengths = np.random.default_rng(0).integers(1, 3000, 2000)
    for max_samples in (3, 5, 8, 16):
        parts = plan_micro_batches(lengths, 8192, max_samples_per_micro_batch=max_samples)
        assert_plan_invariants(lengths, parts, 8192, max_samples_per_micro_batch=max_samples)
        plans = plan_data_parallel([lengths[:900], lengths[900:]], 8192, max_samples_per_micro_batch=max_samples)
        for rank_lengths, rank_parts in zip((lengths[:900], lengths[900:]), plans):
            assert_plan_invariants(rank_lengths, rank_parts, 8192, max_samples_per_micro_batch=max_samples)


def test_none_changes_nothing():
    lengths = np.random.default_rng(1).integers(1, 3000, 300).tolist()
    assert plan_micro_batches(lengths, 4096, max_samples_per_micro_batch=None) == plan_micro_batches(lengths, 4096)
    assert build_dp_schedule(lengths, 2, 4096, max_samples_per_micro_batch=None) == build_dp_schedule(lengths, 2, 4096)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_sample_cap_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=rf"max_samples_per_micro_batch must be None or a positive int, got {bad!r}"):
        plan_micro_batches([1, 2, 3], 10, max_samples_per_micro_batch=bad)
    with pytest.raises(ValueError, match="max_samples_per_micro_batch"):
        plan_data_parallel([[1, 2, 3]], 10, max_samples_per_micro_batch=bad)
    with pytest.raises(ValueError, match="max_samples_per_micro_batch"):
        build_dp_schedule([1, 2, 3], 1, 10, max_samples_per_micro_batch=bad)


def test_forced_group_larger_than_the_sample_cap():
    message = "forced group of 4 samples exceeds max_samples_per_micro_batch=3"
    with pytest.raises(MicroBatchPlanError, match=message) as caught:
        plan_micro_batches([1] * 8, 100, force_group_size=4, max_samples_per_micro_batch=3)
    assert caught.value.code == MicroBatchPlanError.GROUP_EXCEEDS_SAMPLES
    with pytest.raises(MicroBatchPlanError, match="rank 1: " + message):
        plan_data_parallel([[1] * 4, [1] * 8], 100, force_group_size=4, max_samples_per_micro_batch=3)
    with pytest.raises(ValueError, match=message):
        build_dp_schedule([1] * 8, 2, 100, force_group_size=4, max_samples_per_micro_batch=3)
    with pytest.raises(ValueError, match=r"group of 3 samples exceeds max_samples_per_micro_batch=2: group 1 \(samples \[1, 2, 3\]\)"):
        build_dp_schedule([1] * 4, 1, 100, group_ids=[0, 1, 1, 1], max_samples_per_micro_batch=2)


def test_cannot_satisfy_names_the_sample_cap():
    # 4 samples, at most 1 per micro-batch: 4 micro-batches, rounded up to 6 by the divisor
    with pytest.raises(MicroBatchPlanError, match=r"Cannot satisfy max_token_len=100: .* max_samples_per_micro_batch=1\)"):
        plan_micro_batches([1] * 4, 100, num_batches_divided_by=3, max_samples_per_micro_batch=1)
    with pytest.raises(ValueError, match="Cannot satisfy max_token_len"):
        build_dp_schedule([1] * 4, 3, 100, max_samples_per_micro_batch=1)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capped_inputs(), st.integers(1, 4), st.sampled_from([None, "padded"]))
def test_equal_samples_schedule_keeps_both_caps(case, dp_size, cost_model):
    lengths, cap, max_samples, g, divisor, minimum = case
    groups = len(lengths) // g
    lengths = lengths[: groups // dp_size * dp_size * g]  # every rank the same number of groups
    if not lengths:
        return
    kwargs = dict(force_group_size=g, num_batches_divided_by=divisor, min_num_micro_batch=minimum, cost_model=cost_model)
    try:
        schedule = build_dp_schedule(lengths, dp_size, cap, equal_samples=True, max_samples_per_micro_batch=max_samples,
                                     **kwargs)
    except ValueError as error:
        assert "Cannot satisfy max_token_len" in str(error) and f"max_samples_per_micro_batch={max_samples}" in str(error)
        return
    assert_schedule_invariants(lengths, schedule, cap, dp_size, equal_samples=True,
                               max_samples_per_micro_batch=max_samples, **kwargs)


def test_equal_samples_schedule_count_is_the_sample_bound_where_tokens_never_bind():
    # 2 ranks x 12 samples, at most 4 per micro-batch: 3 micro-batches per rank, none over 4
    schedule = build_dp_schedule([10] * 24, 2, 10_000, equal_samples=True, max_samples_per_micro_batch=4)
    assert schedule.num_micro_batches == 3
    assert [len(mb) for rank in schedule.micro_batches for mb in rank] == [4] * 6
    # forced pairs: at most 2 pairs (5 // 2) per micro-batch, 6 pairs per rank
    schedule = build_dp_schedule([10] * 24, 2, 10_000, equal_samples=True, force_group_size=2,
                                 max_samples_per_micro_batch=5)
    assert schedule.num_micro_batches == 3
    assert max(len(mb) for rank in schedule.micro_batches for mb in rank) == 4
    # the padded cost: runs of the sorted groups, the fewest under both caps
    schedule = build_dp_schedule([10] * 24, 2, 10_000, equal_samples=True, cost_model="padded",
                                 max_samples_per_micro_batch=4)
    assert schedule.num_micro_batches == 3


# ------------------------------------------------------------------ the pieces


def test_repair_exchanges_two_items_for_one_when_no_move_fits():
    # cap 10 tokens, 3 samples. Part 0 holds four items (2, 2, 3, 3: 10 tokens, no room); part
    # 1 holds 6 and 3 (9 tokens, room 1): no item of part 0 moves, but two of its items for one
    # of part 1 keep both parts within 10 tokens, and part 1 has room for one more sample.
    tokens = np.array([2, 2, 3, 3, 6, 3])
    parts, fixed = sample_cap.repair_sample_cap([[0, 1, 2, 3], [4, 5]], tokens, np.ones(6, dtype=np.int64), 10, 3)
    assert fixed
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert all(len(p) <= 3 and tokens[p].sum() <= 10 for p in parts), parts
    # with 7 and 3 in part 1 no pair of part 0 weighs 7 or 3: left over the cap, unbroken
    tokens = np.array([2, 2, 3, 3, 7, 3])
    parts, fixed = sample_cap.repair_sample_cap([[0, 1, 2, 3], [4, 5]], tokens, np.ones(6, dtype=np.int64), 10, 3)
    assert not fixed and sorted(map(sorted, parts)) == [[0, 1, 2, 3], [4, 5]]


def test_split_and_peel_only_ever_take_items_from_a_part():
    tokens = np.array([5, 1, 1, 5, 2, 1, 1])
    ones = np.ones(7, dtype=np.int64)
    parts = [[0, 1, 2, 6], [3, 4, 5]]
    for result in (sample_cap.split_to_sample_cap(parts, ones, 2), sample_cap.peel_to_sample_cap(parts, tokens, ones, 10, 2)):
        assert sorted(i for p in result for i in p) == list(range(7))
        assert all(len(p) <= 2 and tokens[p].sum() <= 10 for p in result)


def test_sample_count_bound():
    assert sample_cap.sample_count_bound(np.ones(17, dtype=np.int64), 4) == 5
    assert sample_cap.sample_count_bound(np.full(6, 3), 8) == 3  # 2 groups of 3 per part of 8
    assert sample_cap.sample_count_bound(np.array([5, 5, 5, 1]), 8) == 3  # no two fives share a part


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(300, 2000), st.integers(1, 12))
def test_padded_count_is_the_fewest_runs_under_both_caps(lengths, cap, max_samples):
    """Under the padded cost with groups of one size the runs of the length-sorted samples under
    both caps are the fewest parts there are; the plan needs no more."""
    parts = plan_micro_batches(lengths, cap, cost_model="padded", max_samples_per_micro_batch=max_samples)
    assert_plan_invariants(lengths, parts, cap, cost_model="padded", max_samples_per_micro_batch=max_samples)
    runs = sample_cap.padded_runs(np.array(lengths), np.ones(len(lengths), dtype=np.int64), cap, max_samples)
    assert len(parts) == len(runs)


def test_a_share_raised_to_the_common_count_keeps_the_sample_cap():
    # At 4 parts the balance puts each 100-token sample alone and the nine 1-token ones together
    # (9 > 4 samples): the raise must repair it (or split the share's own plan), never return it.
    from seqbal.schedule.equal_samples import _raised

    tokens = np.array([100, 100, 100] + [1] * 9, dtype=np.int64)
    samples = np.ones(12, dtype=np.int64)
    own = [[0, 3, 4, 5], [1, 6, 7, 8], [2, 9, 10, 11]]  # meets both caps at 3
    raised = _raised(tokens, tokens * tokens, samples, 300, 4, 4, own)
    assert sorted(i for part in raised for i in part) == list(range(12)) and len(raised) == 4
    assert max(len(part) for part in raised) <= 4
    assert max(int(tokens[part].sum()) for part in raised) <= 300


def _check_raised(raised, own, count, tokens, weights, capacity, max_samples):
    """``raised_within_caps``'s guarantee: ``count`` non-empty parts, every item once, both caps."""
    assert raised is not None, (own, count)
    assert len(raised) == count and all(raised), raised
    assert sorted(i for part in raised for i in part) == list(range(len(tokens)))
    assert all(int(tokens[part].sum()) <= capacity for part in raised), raised
    assert sample_cap.within_sample_cap(raised, weights, max_samples), raised


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(st.integers(0, 4), st.integers(10, 30)), min_size=1, max_size=24),
    st.integers(0, 40),
    st.integers(1, 5),
    st.booleans(),
)
def test_raised_within_caps_keeps_both_caps_at_every_count(tokens, room, max_samples, counted):
    # Own plan: the smallest token partition made to meet the sample cap (both caps hold); every
    # count from its parts up to the items must come back with both caps.
    from seqbal.partition import smallest_feasible_partitions

    tokens = np.array(tokens, dtype=np.int64)
    capacity = max(int(tokens.max()) + room, 1)
    weights = np.ones(len(tokens), dtype=np.int64)
    work = 24 * tokens + tokens * tokens
    _, own = smallest_feasible_partitions(tokens, work, capacity)
    own = sample_cap.capped_pieces(own, tokens, weights, capacity, max_samples)
    balance_work = sample_cap.with_count_weight(work) if counted else work
    for count in range(len(own), len(tokens) + 1):
        raised = sample_cap.raised_within_caps(own, count, tokens, weights, capacity, max_samples,
                                               balance_work=balance_work, split_weights=None if counted else work)
        _check_raised(raised, own, count, tokens, weights, capacity, max_samples)
    assert sample_cap.raised_within_caps(own, len(tokens) + 1, tokens, weights, capacity, max_samples,
                                         balance_work=work) is None


def test_raised_within_caps_splits_its_own_plan_when_the_repair_fails():
    # Cap 26 tokens, 3 samples. At 6 parts the workload balance puts 7, 13, 3 and 6 (26, 26, 19
    # and 16 tokens) alone, three items in a fifth part and the eight short ones together (8 > 3
    # samples); the repair moves two each into 3 and 6, and then nothing fits: 7 and 13 have no
    # token room, and no run of short items weighs what one long one does. The own plan (five
    # parts, both caps) split up to 6 is what keeps both caps.
    tokens = np.array([3, 0, 2, 19, 0, 2, 16, 26, 3, 0, 2, 1, 0, 26, 3], dtype=np.int64)
    weights = np.ones(len(tokens), dtype=np.int64)
    work = 24 * tokens + tokens * tokens
    own = [[1, 4, 7], [9, 12, 13], [3, 5, 10], [6, 8, 14], [0, 2, 11]]
    from seqbal.partition import capped_balanced_partitions

    balanced = capped_balanced_partitions(tokens, work, 26, 6, feasible=own)
    assert not sample_cap.within_sample_cap(balanced, weights, 3)
    assert not sample_cap.repair_sample_cap(balanced, tokens, weights, 26, 3)[1]  # the premise
    raised = sample_cap.raised_within_caps(own, 6, tokens, weights, 26, 3, balance_work=work, split_weights=work)
    _check_raised(raised, own, 6, tokens, weights, 26, 3)
    assert all(any(set(piece) <= set(part) for part in own) for piece in raised)  # pieces of the own plan
