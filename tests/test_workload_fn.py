"""``workload_fn`` and ``micro_batch_order`` in every planner: every guarantee holds under any
workload model and either order (the shared invariant checkers), the model is what the plans
balance (examples that fail if the argument were ignored), and the order is the one asked for.
The 2-rank disagreements are in tests/test_workload_agreement.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from seqbal import (
    StepPlanner,
    TokenBudgetBatchSampler,
    build_dp_schedule,
    calculate_workload,
    make_workload_fn,
    plan_data_parallel,
    plan_micro_batches,
)
from seqbal.epochs.sampler import pack_rows
from seqbal.order import MICRO_BATCH_ORDERS, check_micro_batch_order
from seqbal.workload import checked_workloads, workload_digest
from tests.invariants import assert_plan_invariants, assert_schedule_invariants, micro_batch_cost
from tests.step_invariants import Tracker

#: Workload models a user could pass: per token, per sequence, quadratic, a fitted float time
#: model, a model that ignores short sequences.
MODELS = {
    "tokens": lambda s: s,
    "per_sequence": lambda s: np.full(len(s), 1000, dtype=np.int64),
    "quadratic": lambda s: s * s,
    "fitted_seconds": lambda s: 1e6 * (2e-4 + 3e-6 * s + 4e-10 * s * s),
    "hidden_1024": make_workload_fn(1024),
    "long_only": lambda s: np.where(s > 300, s * s, 0),
}
COST_MODELS = [None, "padded"]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

lengths_lists = st.lists(st.integers(0, 1000), min_size=1, max_size=60)


def _work(model, lengths, part):
    return int(checked_workloads(np.asarray([lengths[i] for i in part], dtype=np.int64), model).sum())


def _sizes(lengths, parts, cost_model):
    return [micro_batch_cost([lengths[i] for i in part], cost_model) for part in parts]


# -- every guarantee, under every model and order -----------------------------------------------


@FAST
@given(lengths=lengths_lists, cap_extra=st.integers(0, 3000), model=st.sampled_from(sorted(MODELS)),
       cost_model=st.sampled_from(COST_MODELS), order=st.sampled_from(MICRO_BATCH_ORDERS),
       minimum=st.none() | st.integers(1, 4), divisor=st.none() | st.integers(1, 3))
def test_plan_micro_batches_keeps_every_guarantee_under_any_workload(lengths, cap_extra, model, cost_model, order,
                                                                      minimum, divisor):
    cap = max(1, micro_batch_cost([max(lengths)], cost_model)) + cap_extra
    kwargs = dict(min_num_micro_batch=minimum, num_batches_divided_by=divisor, cost_model=cost_model)
    try:
        parts = plan_micro_batches(lengths, cap, workload_fn=MODELS[model], micro_batch_order=order, **kwargs)
    except ValueError as error:
        assert "Cannot satisfy" in str(error)
        with pytest.raises(ValueError, match="Cannot satisfy"):  # the model never makes a plan impossible
            plan_micro_batches(lengths, cap, **kwargs)
        return
    assert_plan_invariants(lengths, parts, cap, **kwargs)
    # the model changes which plan, never the count: the count search runs on the cost alone
    assert len(parts) == len(plan_micro_batches(lengths, cap, **kwargs))


@FAST
@given(ranks=st.lists(lengths_lists, min_size=2, max_size=4), model=st.sampled_from(sorted(MODELS)),
       order=st.sampled_from(MICRO_BATCH_ORDERS))
def test_plan_data_parallel_keeps_every_guarantee_under_any_workload(ranks, model, order):
    cap = max(max(r) for r in ranks) + 500
    try:
        plans = plan_data_parallel(ranks, cap, workload_fn=MODELS[model], micro_batch_order=order)
    except ValueError as error:
        assert "Cannot satisfy" in str(error)
        return
    assert len({len(p) for p in plans}) == 1
    for lengths, parts in zip(ranks, plans):
        assert_plan_invariants(lengths, parts, cap)


@FAST
@given(lengths=st.lists(st.integers(1, 1000), min_size=4, max_size=80), dp=st.integers(1, 4),
       model=st.sampled_from(sorted(MODELS)), cost_model=st.sampled_from(COST_MODELS),
       order=st.sampled_from(MICRO_BATCH_ORDERS), equal=st.booleans())
def test_build_dp_schedule_keeps_every_guarantee_under_any_workload(lengths, dp, model, cost_model, order, equal):
    if equal:
        lengths = lengths[: len(lengths) // dp * dp]
    cap = micro_batch_cost([max(lengths)], cost_model) + 700
    try:
        schedule = build_dp_schedule(lengths, dp, cap, workload_fn=MODELS[model], cost_model=cost_model,
                                     micro_batch_order=order, equal_samples=equal)
    except ValueError as error:
        assert "micro-batches" in str(error) or "groups" in str(error)
        return
    workloads = checked_workloads(np.asarray(lengths, dtype=np.int64), MODELS[model]).tolist()
    assert_schedule_invariants(lengths, schedule, cap, dp, cost_model=cost_model, equal_samples=equal,
                               workloads=workloads)


@FAST
@given(adds=st.lists(st.lists(st.integers(1, 400), min_size=1, max_size=20), min_size=1, max_size=5),
       model=st.sampled_from(sorted(MODELS)), order=st.sampled_from(MICRO_BATCH_ORDERS), fixed_count=st.booleans())
def test_step_planner_keeps_every_promise_under_any_workload(adds, model, order, fixed_count):
    cap, ranks = 600, 2
    mode = dict(micro_batches_per_step=2) if fixed_count else dict(samples_per_step=8)
    planner = StepPlanner(cap, ranks, workload_fn=MODELS[model], micro_batch_order=order, **mode)
    tracker = Tracker(cap, ranks, k=mode.get("micro_batches_per_step"), s=mode.get("samples_per_step"))
    index = 0
    for lengths in adds:
        indices = list(range(index, index + len(lengths)))
        index += len(lengths)
        planner.add(indices, lengths)
        tracker.added(indices, lengths)
        tracker.check_step(planner.next_step(), flush=False)
    while planner.pending:
        tracker.check_step(planner.next_step(flush=True), flush=True)


@FAST
@given(lengths=st.lists(st.integers(1, 900), min_size=8, max_size=120), model=st.sampled_from(sorted(MODELS)),
       cost_model=st.sampled_from(COST_MODELS), ranks=st.integers(1, 3))
def test_sampler_and_pack_rows_keep_every_guarantee_under_any_workload(lengths, model, cost_model, ranks):
    cap = 1000
    try:
        sampler = TokenBudgetBatchSampler(lengths, cap, num_replicas=ranks, rank=0, cost_model=cost_model,
                                          workload_fn=MODELS[model])
    except ValueError as error:
        assert "Cannot satisfy" in str(error)
        return
    for epoch in range(2):
        plan = sampler.epoch_plan(epoch)
        assert len({len(rank) for rank in plan}) == 1
        seen = sorted(i for rank in plan for mb in rank for i in mb)
        assert seen == list(range(len(lengths)))
        assert all(micro_batch_cost([lengths[i] for i in mb], cost_model) <= cap for rank in plan for mb in rank)
    try:
        rows = pack_rows(lengths, cap, num_replicas=ranks, cost_model=cost_model, workload_fn=MODELS[model])
    except ValueError as error:
        assert "num_replicas" in str(error)
        return
    assert sorted(i for rank in rows for row in rank for i in row) == list(range(len(lengths)))
    assert all(micro_batch_cost([lengths[i] for i in row], cost_model) <= cap for rank in rows for row in rank)


# -- the model is what the plans balance (each example fails if workload_fn were ignored) --------

#: Sequences are what costs here: a micro-batch's work is its number of sequences.
PER_SEQUENCE = MODELS["per_sequence"]


def test_plan_micro_batches_balances_the_given_workload():
    lengths = [90] + [10] * 9
    default = plan_micro_batches(lengths, 200, min_num_micro_batch=2)
    counted = plan_micro_batches(lengths, 200, min_num_micro_batch=2, workload_fn=PER_SEQUENCE)
    assert sorted(map(len, default)) == [1, 9]  # tokens balanced: 90 and 90
    assert sorted(map(len, counted)) == [5, 5]  # sequences balanced


def test_plan_data_parallel_and_rearrange_balance_the_given_workload():
    import torch
    from tensordict import TensorDict

    from seqbal import rearrange_micro_batches

    lengths = [90] + [10] * 9
    plans = plan_data_parallel([lengths, lengths], 200, min_num_micro_batch=2, workload_fn=PER_SEQUENCE)
    assert all(sorted(map(len, parts)) == [5, 5] for parts in plans)
    mask = torch.zeros(len(lengths), 90, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    batch = TensorDict({"attention_mask": mask}, batch_size=[len(lengths)])
    _, indices = rearrange_micro_batches(batch, 200, min_num_micro_batch=2, workload_fn=PER_SEQUENCE)
    assert sorted(map(len, indices)) == [5, 5]


@pytest.mark.parametrize("cost_model", [None, "padded"])
def test_build_dp_schedule_balances_the_given_workload(cost_model):
    lengths = [90] + [10] * 9 + [90] + [10] * 9
    default = build_dp_schedule(lengths, 2, 200, min_num_micro_batch=2, cost_model=cost_model)
    counted = build_dp_schedule(lengths, 2, 200, min_num_micro_batch=2, cost_model=cost_model,
                                workload_fn=PER_SEQUENCE)
    spread = [max(map(len, rank)) - min(map(len, rank)) for rank in counted.micro_batches]
    assert max(spread) < max(max(map(len, rank)) - min(map(len, rank)) for rank in default.micro_batches)
    assert counted.workloads == tuple([1000] * 20)


def test_step_planner_balances_the_given_workload():
    lengths = [90] + [10] * 9 + [90] + [10] * 9
    results = {}
    for name, model in (("default", None), ("counted", PER_SEQUENCE)):
        planner = StepPlanner(200, 2, micro_batches_per_step=2, workload_fn=model, even_slots=True)
        planner.add(range(20), lengths)
        step = planner.next_step(flush=True)
        results[name] = max(len(mb) for rank in step for mb in rank) - min(len(mb) for rank in step for mb in rank)
    assert results["counted"] < results["default"]


def _slots_interleave(plan, lengths, model) -> bool:
    """Whether two slots' workload ranges (under ``model``) overlap: the slots were not cut from
    the micro-batches sorted by that model's workload."""
    ranges = []
    for slot in zip(*plan):
        works = [_work(model, lengths, mb) for mb in slot]
        ranges.append((min(works), max(works)))
    return any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(ranges) for b in ranges[i + 1:])


def test_sampler_and_pack_rows_cut_slots_on_the_given_workload():
    lengths = np.random.default_rng(5).integers(1, 400, 300).tolist()
    model = MODELS["long_only"]
    for shuffle in (False, True):
        ours = TokenBudgetBatchSampler(lengths, 1024, num_replicas=2, rank=0, shuffle=shuffle, workload_fn=model)
        theirs = TokenBudgetBatchSampler(lengths, 1024, num_replicas=2, rank=0, shuffle=shuffle)
        assert not _slots_interleave(ours.epoch_plan(1), lengths, model)
        assert _slots_interleave(theirs.epoch_plan(1), lengths, model)
    assert not _slots_interleave(pack_rows(lengths, 1024, num_replicas=2, workload_fn=model), lengths, model)
    assert _slots_interleave(pack_rows(lengths, 1024, num_replicas=2), lengths, model)


def test_no_workload_fn_and_the_default_model_plan_alike():
    lengths = np.random.default_rng(1).integers(1, 3000, 200).tolist()
    assert plan_micro_batches(lengths, 4096) == plan_micro_batches(lengths, 4096, workload_fn=calculate_workload)
    assert build_dp_schedule(lengths, 4, 4096) == build_dp_schedule(lengths, 4, 4096, workload_fn=calculate_workload)
    assert workload_digest(None) == workload_digest(calculate_workload)


@pytest.mark.parametrize("bad, message", [
    (lambda s: -s, "negative workload"),
    (lambda s: s[:1], "shape"),
    (lambda s: s * np.nan, "finite"),
    ("tokens", "callable"),
])
def test_a_bad_workload_fn_is_a_value_error_naming_it_everywhere(bad, message):
    for cost_model in COST_MODELS:  # the padded plan checks the model before its agreement too
        with pytest.raises(ValueError, match=message):
            plan_micro_batches([5, 6], 20, workload_fn=bad, cost_model=cost_model)
    with pytest.raises(ValueError, match=message):
        StepPlanner(20, 1, micro_batches_per_step=1, workload_fn=bad)
    with pytest.raises(ValueError, match=message):
        TokenBudgetBatchSampler([5, 6], 20, num_replicas=1, rank=0, workload_fn=bad)
    if callable(bad):
        with pytest.raises(ValueError, match=message):
            build_dp_schedule([5, 6], 1, 20, workload_fn=bad)


# -- micro_batch_order ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["largest", "Pipeline", None, 1])
def test_an_unknown_order_is_a_value_error_naming_the_allowed_values(value):
    for call in (lambda: plan_micro_batches([5, 6], 20, micro_batch_order=value),
                 lambda: build_dp_schedule([5, 6], 1, 20, micro_batch_order=value),
                 lambda: StepPlanner(20, 1, micro_batches_per_step=1, micro_batch_order=value),
                 lambda: check_micro_batch_order(value)):
        with pytest.raises(ValueError, match="'pipeline', 'largest_first'"):
            call()


@FAST
@given(lengths=st.lists(st.integers(1, 1000), min_size=2, max_size=60), cost_model=st.sampled_from(COST_MODELS),
       model=st.sampled_from(sorted(MODELS)))
def test_largest_first_runs_the_largest_micro_batch_first_and_pipeline_is_unchanged(lengths, cost_model, model):
    cap = micro_batch_cost([max(lengths)], cost_model) + 300
    fn = MODELS[model]
    largest = plan_micro_batches(lengths, cap, cost_model=cost_model, workload_fn=fn, micro_batch_order="largest_first")
    sizes = _sizes(lengths, largest, cost_model)
    assert sizes == sorted(sizes, reverse=True)
    pipeline = plan_micro_batches(lengths, cap, cost_model=cost_model, workload_fn=fn)
    assert sorted(map(sorted, pipeline)) == sorted(map(sorted, largest))  # the same micro-batches
    assert pipeline == plan_micro_batches(lengths, cap, cost_model=cost_model, workload_fn=fn,
                                          micro_batch_order="pipeline")
    unordered = plan_micro_batches(lengths, cap, cost_model=cost_model, workload_fn=fn, use_dynamic_bsz_balance=False)
    assert unordered == plan_micro_batches(lengths, cap, cost_model=cost_model, workload_fn=fn,
                                           use_dynamic_bsz_balance=False, micro_batch_order="largest_first")


@FAST
@given(lengths=st.lists(st.integers(1, 1000), min_size=8, max_size=80), dp=st.integers(2, 4),
       cost_model=st.sampled_from(COST_MODELS))
def test_largest_first_schedule_orders_slots_by_their_largest_micro_batch_and_keeps_the_slots(lengths, dp, cost_model):
    cap = micro_batch_cost([max(lengths)], cost_model) + 500
    largest = build_dp_schedule(lengths, dp, cap, cost_model=cost_model, micro_batch_order="largest_first")
    pipeline = build_dp_schedule(lengths, dp, cap, cost_model=cost_model)
    slot_max = [max(_sizes(lengths, slot, cost_model)) for slot in zip(*largest.micro_batches)]
    assert slot_max == sorted(slot_max, reverse=True)
    # the same slots (micro-batches of similar work, one per rank), only in another order
    assert sorted(map(sorted, zip(*largest.micro_batches))) == sorted(map(sorted, zip(*pipeline.micro_batches)))
    assert_schedule_invariants(lengths, largest, cap, dp, cost_model=cost_model)


def test_largest_first_step_planner_orders_slots_by_their_largest_micro_batch():
    lengths = np.random.default_rng(3).integers(1, 500, 200).tolist()
    for mode in (dict(micro_batches_per_step=4, even_slots=True), dict(samples_per_step=60)):
        planner = StepPlanner(1000, 3, micro_batch_order="largest_first", **mode)
        planner.add(range(len(lengths)), lengths)
        step = planner.next_step()
        slot_max = [max(sum(lengths[i] for i in mb) for mb in slot) for slot in zip(*step)]
        assert slot_max == sorted(slot_max, reverse=True)


@pytest.mark.parametrize("cost_model", COST_MODELS)
@pytest.mark.parametrize("order", MICRO_BATCH_ORDERS)
def test_the_sampler_orders_the_slots_of_every_optimizer_step_and_keeps_its_micro_batches(cost_model, order):
    lengths = np.random.default_rng(4).integers(1, 900, 300).tolist()
    kwargs = dict(num_replicas=2, rank=0, gradient_accumulation_steps=4, cost_model=cost_model)
    plain = TokenBudgetBatchSampler(lengths, 2048, **kwargs)
    ordered = TokenBudgetBatchSampler(lengths, 2048, micro_batch_order=order, **kwargs)
    for epoch in range(3):
        mine, theirs = ordered.epoch_plan(epoch), plain.epoch_plan(epoch)
        for rank in range(2):  # the same micro-batches on every rank, only in another order
            assert sorted(map(sorted, mine[rank])) == sorted(map(sorted, theirs[rank]))
        for start in range(0, len(mine[0]), 4):
            slots = list(zip(*(rank[start:start + 4] for rank in mine)))
            largest = [max(micro_batch_cost([lengths[i] for i in mb], cost_model) for mb in slot) for slot in slots]
            works = [sum(_work(None, lengths, mb) for mb in slot) for slot in slots]
            if order == "largest_first":
                assert largest == sorted(largest, reverse=True)
            else:  # light slots at both ends, the heaviest inside
                assert max(works) not in (works[0], works[-1]) or len(set(works)) == 1
    with pytest.raises(ValueError, match="'pipeline', 'largest_first'"):
        TokenBudgetBatchSampler(lengths, 2048, micro_batch_order="heaviest", **kwargs)
