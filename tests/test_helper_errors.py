"""Wrong errors and type leaks of the helpers around the plan (issue 30, point 6).

Each helper given a bad argument raises a ``ValueError`` that names it (never a
``ZeroDivisionError``, ``OverflowError``, ``TypeError`` or ``RuntimeError`` from deep inside),
and a valid NumPy integer gives the result its Python int gives, in plain Python numbers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from seqbal import (
    MicroBatchPlanError,
    build_dp_schedule,
    calculate_workload,
    dummy_source,
    get_reverse_idx,
    get_group_balanced_partitions,
    get_seqlen_balanced_partitions,
    karmarkar_karp,
    log_seqlen_unbalance,
    micro_batch_metrics,
    plan_micro_batches,
    restore_dynamic_batch,
)
from seqbal.partition import capped_balanced_partitions

from .invariants import assert_plan_invariants


@pytest.mark.parametrize("cap", [0, -1, 2.5, "8", True, None, 2**64])
def test_micro_batch_metrics_rejects_a_cap_that_is_not_a_positive_int(cap):
    with pytest.raises(ValueError, match="max_token_len"):
        micro_batch_metrics([4, 4], [[0], [1]], cap)


@pytest.mark.parametrize("cap", [np.uint16(8), np.int64(8), np.int8(8), 8])
def test_micro_batch_metrics_of_a_numpy_cap_are_plain_python_numbers(cap):
    metrics = micro_batch_metrics(np.array([4, 4, 3]), [[0], [1, 2], []], cap, cost_model="padded")
    assert metrics == micro_batch_metrics([4, 4, 3], [[0], [1, 2], []], 8, cost_model="padded")
    assert all(type(value) in (int, float) for value in metrics.values()), {k: type(v) for k, v in metrics.items()}
    json.dumps(metrics)
    assert metrics["seqbal/lower_bound"] == 2 and metrics["seqbal/dummies"] == 1


@pytest.mark.parametrize("cost_model", [None, "padded"])
def test_micro_batch_metrics_of_huge_lengths_take_the_float64_route(cost_model):
    metrics = micro_batch_metrics([2**34] * 4, [[0, 1], [2, 3]], 2**36, cost_model=cost_model)
    assert metrics["seqbal/workload_imbalance"] == 1.0 and metrics["seqbal/max_tokens"] == 2**35


@pytest.mark.parametrize("size", [2.5, "2", True, None, 0, -1, np.float64(2.0)])
def test_dummy_source_rejects_a_group_size_that_is_not_a_positive_int(size):
    with pytest.raises(MicroBatchPlanError, match="force_group_size"):
        dummy_source([1, 2, 3, 4], size)


def test_dummy_source_takes_numpy_group_sizes():
    assert dummy_source([5, 2, 7, 1], np.uint8(2)) == dummy_source([5, 2, 7, 1], 2) == [0, 1]


@pytest.mark.parametrize("flag", [torch.tensor([1, 0]), np.array([True, False]), "yes", None, 2])
def test_karmarkar_karp_rejects_an_equal_size_that_is_not_a_bool(flag):
    with pytest.raises(ValueError, match="equal_size"):
        karmarkar_karp([1, 2, 3, 4], 2, equal_size=flag)
    with pytest.raises(ValueError, match="equal_size"):
        get_seqlen_balanced_partitions([1, 2, 3, 4], 2, equal_size=flag)


def test_karmarkar_karp_takes_numpy_and_one_element_bools():
    expected = karmarkar_karp([1, 2, 3, 4], 2, equal_size=True)
    assert karmarkar_karp([1, 2, 3, 4], 2, equal_size=np.True_) == expected
    assert karmarkar_karp([1, 2, 3, 4], 2, equal_size=torch.tensor(True)) == expected


@pytest.mark.parametrize("cost_model", ["padded", None])
def test_huge_lengths_plan_under_the_padded_cost_as_under_the_token_cost(cost_model):
    lengths = [2**34] * 8
    plan = plan_micro_batches(lengths, 2**36, cost_model=cost_model)
    assert_plan_invariants(lengths, plan, 2**36, cost_model=cost_model)
    assert len(plan) == 2
    schedule = build_dp_schedule(lengths, 2, 2**36, cost_model=cost_model)
    assert sorted(i for rank in schedule.micro_batches for part in rank for i in part) == list(range(8))


@pytest.mark.parametrize("k", [0, -1, 2**64, 2.5, None])
def test_capped_balanced_partitions_rejects_a_count_that_is_not_a_positive_int64(k):
    with pytest.raises(ValueError, match=r"\bk\b"):
        capped_balanced_partitions([1, 2, 3], [1, 2, 3], 10, k)


def test_capped_balanced_partitions_above_the_items_is_still_none():
    assert capped_balanced_partitions([1, 2, 3], [1, 2, 3], 10, 4) is None


@pytest.mark.parametrize("lengths", [np.array(5), (x for x in [1, 2, 3, 4]), 7, None])
def test_partitioners_reject_lengths_that_are_not_a_sequence(lengths):
    with pytest.raises(ValueError, match="seqlen_list"):
        get_seqlen_balanced_partitions(lengths, 2, False)


def test_group_balanced_partitions_reject_a_zero_dimensional_array():
    with pytest.raises(ValueError, match="seqlen_list"):
        get_group_balanced_partitions(np.array(5), [0], 1)


@pytest.mark.parametrize("idx_map", [[1.5, 0], [1.0, 0.0], [True, False], None, [[0, 1]]])
def test_get_reverse_idx_rejects_what_is_not_a_permutation_of_ints(idx_map):
    with pytest.raises(ValueError, match="idx_map"):
        get_reverse_idx(idx_map)


def test_get_reverse_idx_takes_arrays_tensors_and_iterables():
    for idx_map in (np.array([2, 0, 1], dtype=np.uint8), torch.tensor([2, 0, 1]), iter([2, 0, 1])):
        assert get_reverse_idx(idx_map) == [1, 2, 0]


def test_restore_rejects_float_indices():
    with pytest.raises(ValueError, match="idx_map|batch_idx_list"):
        restore_dynamic_batch(torch.arange(4.0)[:, None], [[0, 2.0], [1, 3]])


@pytest.mark.parametrize("partitions", [[[0, 5]], [[0], [0]], [[0], [1.0]]])
def test_log_seqlen_unbalance_rejects_partitions_that_are_not_of_the_samples(partitions):
    with pytest.raises(ValueError, match="partitions"):
        log_seqlen_unbalance([1, 2], partitions, "p")


def test_log_seqlen_unbalance_of_numpy_lengths_is_plain_python():
    metrics = log_seqlen_unbalance(np.array([1, 2, 3, 4], dtype=np.uint16), [[0, 3], [1, 2]], "p")
    assert metrics == log_seqlen_unbalance([1, 2, 3, 4], [[0, 3], [1, 2]], "p")
    assert all(type(value) in (int, float) for value in metrics.values())


@pytest.mark.parametrize("lengths", [torch.tensor([1.5]), torch.tensor([True]), [-1], torch.tensor([-1])])
def test_calculate_workload_rejects_lengths_that_are_not_non_negative_ints(lengths):
    with pytest.raises(ValueError, match="seqlens"):
        calculate_workload(lengths)


# ---------------------------------------------------------------------------------------------
# The sweep: any junk argument to a public helper is a ValueError or a result, never another
# exception from deep inside
# ---------------------------------------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from seqbal.partition import ceildiv, roundup_divisible  # noqa: E402

JUNK = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([np.uint8(3), np.int16(-2), np.uint64(2**63 + 1), np.float32(2.0), np.bool_(True)]),
    st.lists(st.integers(-3, 2**65), max_size=4),
    st.sampled_from([np.array(5), torch.tensor([1, 0]), torch.tensor(2.5), torch.tensor([1.5, 2.0]), np.array([[1, 2]])]),
)

HELPERS = {
    "ceildiv(a)": lambda v: ceildiv(v, 3),
    "ceildiv(b)": lambda v: ceildiv(7, v),
    "roundup_divisible(a)": lambda v: roundup_divisible(v, 3),
    "roundup_divisible(b)": lambda v: roundup_divisible(7, v),
    "get_reverse_idx": lambda v: get_reverse_idx(v),
    "restore_dynamic_batch(batch_idx_list)": lambda v: restore_dynamic_batch(torch.arange(2.0), v),
    "log_seqlen_unbalance(seqlen_list)": lambda v: log_seqlen_unbalance(v, [[0], [1]], "p"),
    "log_seqlen_unbalance(partitions)": lambda v: log_seqlen_unbalance([1, 2], v, "p"),
    "get_group_balanced_partitions(seqlen_list)": lambda v: get_group_balanced_partitions(v, [0, 1], 2),
    "get_group_balanced_partitions(k)": lambda v: get_group_balanced_partitions([1, 2], [0, 1], v),
    "calculate_workload": lambda v: calculate_workload(v),
    "karmarkar_karp(seqlen_list)": lambda v: karmarkar_karp(v, 1, equal_size=False),
    "karmarkar_karp(k)": lambda v: karmarkar_karp([1, 2], v, equal_size=False),
    "karmarkar_karp(equal_size)": lambda v: karmarkar_karp([1, 2], 2, equal_size=v),
    "get_seqlen_balanced_partitions(seqlen_list)": lambda v: get_seqlen_balanced_partitions(v, 1, False),
    "capped_balanced_partitions(k)": lambda v: capped_balanced_partitions([1, 2], [1, 2], 10, v),
    "capped_balanced_partitions(capacity)": lambda v: capped_balanced_partitions([1, 2], [1, 2], v, 1),
    "micro_batch_metrics(max_token_len)": lambda v: micro_batch_metrics([4, 4], [[0], [1]], v),
    "micro_batch_metrics(lengths)": lambda v: micro_batch_metrics(v, [[0], [1]], 8),
    "dummy_source(force_group_size)": lambda v: dummy_source([1, 2], v),
}


@pytest.mark.parametrize("helper", sorted(HELPERS))
@settings(max_examples=60, deadline=None)
@given(value=JUNK)
def test_a_junk_argument_is_a_value_error_or_a_result(helper, value):
    try:
        result = HELPERS[helper](value)
    except ValueError:
        return
    if isinstance(result, dict):
        json.dumps(result)  # plain Python numbers


def test_micro_batch_metrics_rejects_index_lists_that_are_not_of_the_samples():
    with pytest.raises(ValueError, match="batch_idx_list: bin 0 holds 0, not an index into 0 items"):
        micro_batch_metrics([], [[0], [1]], 8)
    with pytest.raises(ValueError, match="batch_idx_list: item 0 appears twice"):
        micro_batch_metrics([4, 4], [[0], [0, 1]], 8)
    with pytest.raises(ValueError, match="partitions must be a list of index lists, got None"):
        log_seqlen_unbalance([1, 2], None, "p")
