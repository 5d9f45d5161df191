"""rearrange_micro_batches / plan_micro_batches on one process: documented cases, errors,
round trips, determinism, and every SPEC guarantee on random inputs (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict

from seqbal import (
    MicroBatchPlanError,
    calculate_workload,
    ceildiv,
    effective_lengths,
    get_reverse_idx,
    karmarkar_karp,
    plan_data_parallel,
    plan_micro_batches,
    rearrange_micro_batches,
    restore_dynamic_batch,
    roundup_divisible,
)

from .invariants import assert_plan_invariants


def dense_batch(lengths, seq_len=None, seed=0):
    """A right-padded batch: attention_mask ones for the first ``length`` positions."""
    lengths = list(lengths)
    seq_len = seq_len or max(max(lengths), 1)
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids = torch.randint(0, 1000, (len(lengths), seq_len), generator=generator) * mask
    return TensorDict(
        {"input_ids": input_ids, "attention_mask": mask, "values": torch.randn(len(lengths), seq_len, generator=generator)},
        batch_size=[len(lengths)],
    )


def older_kk_loop(lengths, cap, force_group_size=1, num_batches_divided_by=None, min_num_micro_batch=None):
    """Reference: the older strict design. ceildiv start, KK on workloads, +step until within cap.

    Returns the count, or None where the loop runs out of groups.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    tokens = lengths.reshape(-1, force_group_size).sum(1)
    work = calculate_workload(lengths).reshape(-1, force_group_size).sum(1)
    step = num_batches_divided_by or 1
    k = roundup_divisible(max(ceildiv(int(tokens.sum()), cap), min_num_micro_batch or 1, 1), step)
    while k <= len(tokens):
        parts = karmarkar_karp(work, k, equal_size=False)
        if all(int(tokens[p].sum()) <= cap for p in parts):
            return k
        k += step
    return None


# ------------------------------------------------------------------ documented cases


def test_pr_example_eight_sevens_cap_eight():
    micro_batches, indices = rearrange_micro_batches(dense_batch([7] * 8), max_token_len=8)
    assert len(micro_batches) == 8 and len(indices) == 8
    for micro_batch in micro_batches:
        assert int(micro_batch["attention_mask"].sum()) <= 8
    assert_plan_invariants([7] * 8, indices, 8)


def test_forced_group_over_cap_is_a_value_error():
    with pytest.raises(ValueError, match="forced group exceeds max_token_len") as info:
        plan_micro_batches([200, 210], max_token_len=300, force_group_size=2)
    assert "410" in str(info.value) and "300" in str(info.value)


def test_lower_bound_met_when_possible():
    parts = plan_micro_batches([4] * 8, max_token_len=8)
    assert len(parts) == 4
    assert_plan_invariants([4] * 8, parts, 8)


def test_tighter_than_ceildiv_for_items_over_half_the_cap():
    lengths = [51] * 10  # ceildiv = 6, but no two fit together
    parts = plan_micro_batches(lengths, max_token_len=100)
    assert len(parts) == 10


def test_divisor_and_minimum_are_respected():
    lengths = [10] * 12
    parts = plan_micro_batches(lengths, 40, num_batches_divided_by=4, min_num_micro_batch=5)
    assert len(parts) == 8
    assert_plan_invariants(lengths, parts, 40, num_batches_divided_by=4, min_num_micro_batch=5)


def test_forced_groups_stay_together():
    lengths = [3, 4, 5, 1, 2, 6, 7, 1]
    parts = plan_micro_batches(lengths, 10, force_group_size=2)
    assert_plan_invariants(lengths, parts, 10, force_group_size=2)


def test_dynamic_balance_puts_heaviest_in_the_middle():
    lengths = [100, 200, 300, 400, 500, 600]
    parts = plan_micro_batches(lengths, 600)
    work = [int(calculate_workload(np.asarray(lengths)[p]).sum()) for p in parts]
    peak = int(np.argmax(work))
    assert all(work[i] <= work[i + 1] for i in range(peak))
    assert all(work[i] >= work[i + 1] for i in range(peak, len(work) - 1))
    unordered = plan_micro_batches(lengths, 600, use_dynamic_bsz_balance=False)
    assert sorted(map(tuple, unordered)) == sorted(map(tuple, parts))


def test_zero_length_samples_are_placed():
    lengths = [0, 0, 5, 0]
    parts = plan_micro_batches(lengths, 5)
    assert_plan_invariants(lengths, parts, 5)


def test_single_sample_equal_to_cap():
    assert plan_micro_batches([8], 8) == [[0]]


def test_plan_accepts_tensor_and_numpy():
    lengths = [5, 3, 8, 2, 7]
    expected = plan_micro_batches(lengths, 10)
    assert plan_micro_batches(torch.tensor(lengths), 10) == expected
    assert plan_micro_batches(np.array(lengths, dtype=np.int32), 10) == expected


def test_rearrange_equals_plan():
    lengths = [5, 17, 3, 9, 12, 1, 30, 2]
    _, indices = rearrange_micro_batches(dense_batch(lengths), 32)
    assert indices == plan_micro_batches(lengths, 32)


def test_call_at_1024_bimodal_is_fast_enough_to_run_in_the_suite():
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(7, 0.8, 1024).astype(int).clip(1, 8000)
    lengths[rng.random(1024) < 0.2] = 8000
    parts = plan_micro_batches(lengths, 16384)
    assert_plan_invariants(lengths, parts, 16384)
    reference = older_kk_loop(lengths, 16384)
    assert reference is not None and len(parts) <= reference


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(max_token_len=0), r"max_token_len must be a positive int, got 0"),
        (dict(max_token_len=-5), r"got -5"),
        (dict(max_token_len=8.5), r"got 8\.5"),
        (dict(max_token_len=True), r"got True"),
        (dict(max_token_len=100, force_group_size=0), r"force_group_size must be an int >= 1, got 0"),
        (dict(max_token_len=100, force_group_size=3), r"force_group_size=3 does not divide the batch size 4"),
        (dict(max_token_len=100, num_batches_divided_by=0), r"num_batches_divided_by .* got 0"),
        (dict(max_token_len=100, min_num_micro_batch=0), r"min_num_micro_batch .* got 0"),
        (dict(max_token_len=100, min_num_micro_batch=5), r"Cannot satisfy max_token_len=100.*need at least 5"),
        (dict(max_token_len=100, num_batches_divided_by=8), r"Cannot satisfy max_token_len=100.*at least 8"),
        (dict(max_token_len=6), r"sample 1 has 9 tokens, which exceeds max_token_len=6"),
    ],
)
def test_bad_inputs_raise_value_errors_with_numbers(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        plan_micro_batches([3, 9, 4, 5], **kwargs)


def test_negative_length_names_the_sample():
    with pytest.raises(ValueError, match=r"sample 2 has a negative length \(-1 tokens\)"):
        plan_micro_batches([3, 4, -1], 10)


def test_empty_batch():
    with pytest.raises(ValueError, match="empty"):
        plan_micro_batches([], 10)
    with pytest.raises(ValueError, match="empty"):
        rearrange_micro_batches(TensorDict({"attention_mask": torch.ones(0, 4)}, batch_size=[0]), 10)


def test_missing_lengths_and_bad_mask():
    with pytest.raises(ValueError, match="neither a nested 'input_ids' nor an 'attention_mask'"):
        rearrange_micro_batches(TensorDict({"input_ids": torch.ones(2, 3)}, batch_size=[2]), 10)
    with pytest.raises(ValueError, match=r"attention_mask must be 2-D .* got shape \(2, 3, 1\)"):
        rearrange_micro_batches(TensorDict({"attention_mask": torch.ones(2, 3, 1)}, batch_size=[2]), 10)


def test_errors_are_plan_errors_and_value_errors():
    with pytest.raises(MicroBatchPlanError) as info:
        plan_micro_batches([5], 4)
    assert isinstance(info.value, ValueError)
    assert info.value.code == MicroBatchPlanError.SAMPLE_EXCEEDS


def test_float_lengths_are_rejected():
    with pytest.raises(ValueError, match="integers"):
        plan_micro_batches([1.5, 2.0], 10)
    with pytest.raises(ValueError, match="integers"):
        plan_micro_batches(torch.tensor([1.0, 2.0]), 10)


# ------------------------------------------------------------------ round trips


def test_round_trip_dense():
    lengths = [5, 17, 3, 9, 12, 1, 30, 2, 8, 8]
    batch = dense_batch(lengths)
    micro_batches, indices = rearrange_micro_batches(batch, 32)
    for micro_batch, part in zip(micro_batches, indices):
        assert torch.equal(micro_batch["input_ids"], batch["input_ids"][part])
    for key in ("input_ids", "attention_mask", "values"):
        merged = torch.cat([mb[key] for mb in micro_batches])
        assert torch.equal(restore_dynamic_batch(merged, indices), batch[key])
    restored = restore_dynamic_batch(torch.cat(micro_batches), indices)
    assert (restored == batch).all()


def test_round_trip_jagged_nested_input_ids():
    lengths = [5, 17, 3, 9, 12, 1, 30, 2]
    sequences = [torch.arange(n) + 100 * i for i, n in enumerate(lengths)]
    input_ids = torch.nested.nested_tensor(sequences, layout=torch.jagged)
    batch = TensorDict({"input_ids": input_ids, "score": torch.arange(len(lengths))}, batch_size=[len(lengths)])
    assert effective_lengths(batch).tolist() == lengths
    micro_batches, indices = rearrange_micro_batches(batch, 32)
    assert_plan_invariants(lengths, indices, 32)
    outputs = [t for mb in micro_batches for t in mb["input_ids"].unbind()]
    merged = torch.nested.as_nested_tensor(outputs, layout=torch.jagged)
    restored = restore_dynamic_batch(merged, indices)
    assert restored.is_nested
    for original, back in zip(sequences, restored.unbind()):
        assert torch.equal(original, back)
    scores = torch.cat([mb["score"] for mb in micro_batches])
    assert restore_dynamic_batch(scores, indices).tolist() == list(range(len(lengths)))


def test_round_trip_keeps_non_tensor_entries():
    lengths = [4, 6, 2, 8, 5]
    batch = dense_batch(lengths)
    batch["uid"] = NonTensorStack(*[f"uid-{i}" for i in range(len(lengths))])
    batch["tag"] = NonTensorData("rollout-7")
    micro_batches, indices = rearrange_micro_batches(batch, 10)
    uids = []
    for micro_batch, part in zip(micro_batches, indices):
        assert micro_batch["tag"] == "rollout-7"
        assert list(micro_batch["uid"]) == [f"uid-{i}" for i in part]
        uids.extend(micro_batch["uid"])
    order = get_reverse_idx([i for part in indices for i in part])
    assert [uids[j] for j in order] == [f"uid-{i}" for i in range(len(lengths))]


def test_get_reverse_idx_inverts_and_validates():
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]
    with pytest.raises(ValueError, match="permutation"):
        get_reverse_idx([0, 0, 1])


def test_restore_rejects_wrong_row_count():
    with pytest.raises(ValueError, match="3 rows but batch_idx_list holds 2"):
        restore_dynamic_batch(torch.zeros(3), [[0], [1]])


# ------------------------------------------------------------------ determinism


def test_determinism_same_index_lists():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 4000, 300)
    first = plan_micro_batches(lengths, 12288, force_group_size=3)
    second = plan_micro_batches(lengths.copy(), 12288, force_group_size=3)
    assert first == second


# ------------------------------------------------------------------ properties


@st.composite
def plan_inputs(draw):
    cap = draw(st.integers(1, 200))
    group = draw(st.sampled_from([1, 1, 2, 3, 4]))
    n_groups = draw(st.integers(1, 40))
    per_sample_max = max(cap // group, 0)
    lengths = draw(
        st.lists(
            st.one_of(st.integers(0, per_sample_max), st.just(per_sample_max), st.just(0)),
            min_size=n_groups * group,
            max_size=n_groups * group,
        )
    )
    divisor = draw(st.one_of(st.none(), st.integers(1, 4)))
    minimum = draw(st.one_of(st.none(), st.integers(1, 6)))
    return lengths, cap, group, divisor, minimum


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan_inputs())
def test_every_guarantee_holds_and_count_never_exceeds_older_loop(case):
    lengths, cap, group, divisor, minimum = case
    kwargs = dict(force_group_size=group, num_batches_divided_by=divisor, min_num_micro_batch=minimum)
    try:
        parts = plan_micro_batches(lengths, cap, **kwargs)
    except ValueError as error:
        # Only a count the groups cannot form may fail here: every group fits the cap by construction.
        assert str(error).startswith("Cannot satisfy max_token_len")
        assert older_kk_loop(lengths, cap, group, divisor, minimum) is None
        return
    assert_plan_invariants(lengths, parts, cap, **kwargs)
    reference = older_kk_loop(lengths, cap, group, divisor, minimum)
    if reference is not None:
        assert len(parts) <= reference
    assert plan_micro_batches(lengths, cap, **kwargs) == parts


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=200),
    st.integers(3000, 20000),
)
def test_guarantees_on_larger_batches(lengths, cap):
    parts = plan_micro_batches(lengths, cap)
    assert_plan_invariants(lengths, parts, cap)
    reference = older_kk_loop(lengths, cap)
    assert reference is not None and len(parts) <= reference


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=30), st.integers(300, 900))
def test_rearrange_round_trip_property(lengths, cap):
    batch = dense_batch(lengths)
    micro_batches, indices = rearrange_micro_batches(batch, cap)
    assert_plan_invariants(lengths, indices, cap)
    for micro_batch in micro_batches:
        assert int(micro_batch["attention_mask"].sum()) <= cap
    restored = restore_dynamic_batch(torch.cat(micro_batches), indices)
    assert (restored == batch).all()


# ------------------------------------------------------------------ in-process data-parallel simulation


def test_plan_data_parallel_agrees_on_the_largest_count():
    ranks = [[7] * 8, [1] * 8, [3] * 8]
    plans = plan_data_parallel(ranks, 8)
    alone = [len(plan_micro_batches(lengths, 8)) for lengths in ranks]
    assert alone == [8, 1, 4]  # two 3s per micro-batch: 4, not ceildiv(24, 8) = 3
    assert [len(p) for p in plans] == [8, 8, 8]
    for lengths, parts in zip(ranks, plans):
        assert_plan_invariants(lengths, parts, 8)


def test_plan_data_parallel_errors_name_the_rank():
    with pytest.raises(ValueError, match=r"rank 1: sample 0 has 9 tokens, which exceeds max_token_len=8"):
        plan_data_parallel([[1, 2], [9, 1]], 8)
    with pytest.raises(ValueError, match=r"Cannot satisfy max_token_len=8 .* rank 1 of the data-parallel group has only 2"):
        plan_data_parallel([[8] * 5, [1, 1]], 8)
    with pytest.raises(ValueError, match="empty"):
        plan_data_parallel([], 8)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=20), min_size=1, max_size=4), st.integers(50, 120))
def test_plan_data_parallel_single_rank_equals_plan_and_invariants_hold(ranks, cap):
    try:
        plans = plan_data_parallel(ranks, cap)
    except ValueError as error:
        assert "Cannot satisfy max_token_len" in str(error)
        return
    assert len({len(p) for p in plans}) == 1
    assert len(plans[0]) == max(len(plan_micro_batches(lengths, cap)) for lengths in ranks)
    for lengths, parts in zip(ranks, plans):
        assert_plan_invariants(lengths, parts, cap)
    assert plan_data_parallel(ranks[:1], cap) == [plan_micro_batches(ranks[0], cap)]


def test_bool_and_integer_masks_give_the_same_lengths():
    lengths = [5, 0, 17, 3]
    batch = dense_batch(lengths)
    as_bool = TensorDict({"attention_mask": batch["attention_mask"].bool()}, batch_size=[4])
    strided = TensorDict({"attention_mask": batch["attention_mask"].bool().t().contiguous().t()}, batch_size=[4])
    for candidate in (batch, as_bool, strided):
        lengths_found = effective_lengths(candidate)
        assert lengths_found.dtype == torch.int64 and lengths_found.tolist() == lengths
