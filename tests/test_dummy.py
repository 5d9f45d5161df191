"""Dummy micro-batches (``dummy_micro_batches=True``) in one process.

A one-rank gloo group is sync mode without a peer: a rank is "short" there when
``min_num_micro_batch`` or ``num_batches_divided_by`` asks for more micro-batches than it has
groups. Short ranks among peers are in tests/test_loss.py (2 gloo ranks).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, TensorDict

from seqbal import (
    MicroBatchPlanError,
    dummy_source,
    loss_weights,
    micro_batch_metrics,
    plan_micro_batches,
    rearrange_micro_batches,
    restore_dynamic_batch,
)

from .invariants import assert_plan_invariants, micro_batch_cost


def padded(lengths, width=None):
    width = width or max(lengths)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return TensorDict(
        {
            "attention_mask": mask,
            "input_ids": (torch.arange(width)[None] + 100 * torch.arange(len(lengths))[:, None]) * mask,
            "response_mask": mask,
            "sample": torch.arange(len(lengths)),
        },
        batch_size=[len(lengths)],
    )


def test_short_rank_gets_the_count_with_dummies_at_the_end(world_of_one):
    lengths = [5, 3, 7]
    with pytest.raises(ValueError, match="^Cannot satisfy max_token_len"):
        plan_micro_batches(lengths, 16, dp_group=world_of_one, min_num_micro_batch=5)
    parts = plan_micro_batches(lengths, 16, dp_group=world_of_one, min_num_micro_batch=5, dummy_micro_batches=True)
    assert len(parts) == 5 and parts[3:] == [[], []]
    assert sorted(map(tuple, parts[:3])) == [(0,), (1,), (2,)]
    assert_plan_invariants(lengths, parts, 16, min_num_micro_batch=5, dummy_micro_batches=True)
    with pytest.raises(AssertionError, match="is empty"):  # the checker stays strict without the flag
        assert_plan_invariants(lengths, parts, 16, min_num_micro_batch=5)


def test_divisor_rounds_the_count_with_dummies(world_of_one):
    parts = plan_micro_batches([4, 4, 4], 4, dp_group=world_of_one, num_batches_divided_by=4, dummy_micro_batches=True)
    assert len(parts) == 4 and parts[-1] == []
    assert_plan_invariants([4, 4, 4], parts, 4, num_batches_divided_by=4, dummy_micro_batches=True)


def test_dummies_change_nothing_for_a_rank_that_has_enough_groups(world_of_one):
    lengths = [7, 1, 3, 6, 2, 5, 8, 4]
    for kwargs in ({}, {"min_num_micro_batch": 3}, {"num_batches_divided_by": 2}, {"cost_model": "padded"}):
        plain = plan_micro_batches(lengths, 12, dp_group=world_of_one, **kwargs)
        assert plan_micro_batches(lengths, 12, dp_group=world_of_one, dummy_micro_batches=True, **kwargs) == plain


def test_without_sync_dummies_change_nothing_and_a_short_rank_is_still_an_error():
    lengths = [5, 3, 7]
    assert plan_micro_batches(lengths, 8, dummy_micro_batches=True) == plan_micro_batches(lengths, 8)
    with pytest.raises(ValueError, match="^Cannot satisfy max_token_len"):
        plan_micro_batches(lengths, 8, min_num_micro_batch=5, dummy_micro_batches=True)


def test_a_rank_without_samples_is_an_error_in_both_modes(world_of_one):
    with pytest.raises(MicroBatchPlanError, match="empty.*dummy_micro_batches=True cannot help") as info:
        plan_micro_batches([], 8, dp_group=world_of_one, dummy_micro_batches=True)
    assert info.value.code == MicroBatchPlanError.EMPTY_BATCH
    with pytest.raises(MicroBatchPlanError, match="dummy_micro_batches=True cannot help"):
        plan_micro_batches([], 8, dummy_micro_batches=True)


def test_dummy_flag_must_be_a_bool():
    with pytest.raises(ValueError, match="dummy_micro_batches must be True or False, got 'yes'"):
        plan_micro_batches([1, 2], 8, dummy_micro_batches="yes")


def test_dummy_micro_batch_copies_the_shortest_sample_with_every_key(world_of_one):
    lengths = [6, 2, 5, 2]
    batch = padded(lengths, width=8)
    batch["tag"] = NonTensorData("rollout-7")
    micro_batches, indices = rearrange_micro_batches(
        batch, 16, dp_group=world_of_one, min_num_micro_batch=6, dummy_micro_batches=True
    )
    assert len(micro_batches) == 6 and indices[4:] == [[], []]
    for micro_batch in micro_batches[4:]:
        assert set(micro_batch.keys()) == set(batch.keys())
        assert micro_batch["sample"].tolist() == [1]  # the shortest, first on ties
        assert torch.equal(micro_batch["input_ids"], batch["input_ids"][1:2])
        assert micro_batch["tag"] == "rollout-7"
    assert micro_batches[4]["input_ids"].data_ptr() != micro_batches[5]["input_ids"].data_ptr()  # copies
    # restore drops the dummies' rows, concatenated or as a list
    outputs = [mb["sample"] * 10 for mb in micro_batches]
    assert restore_dynamic_batch(torch.cat(outputs), indices).tolist() == [0, 10, 20, 30]
    assert restore_dynamic_batch(outputs, indices).tolist() == [0, 10, 20, 30]
    assert restore_dynamic_batch(torch.cat(outputs[:4]), indices).tolist() == [0, 10, 20, 30]  # already dropped
    # and loss_weights gives them zero weight
    weights = loss_weights(micro_batches, indices, dp_group=world_of_one)
    assert [w.tolist() for w in weights[4:]] == [[0.0], [0.0]]
    assert sum(float((w * mb["response_mask"].sum(-1)).sum()) for w, mb in zip(weights, micro_batches)) == pytest.approx(1.0)
    metrics = micro_batch_metrics(lengths, indices, 16)
    assert metrics["seqbal/dummies"] == 2 and metrics["seqbal/count"] == 6


def test_dummy_of_forced_groups_is_the_cheapest_group_and_fits_every_cost_model(world_of_one):
    lengths = [3, 9, 6, 5, 1, 12, 7, 7]  # groups of 2: tokens 12, 11, 13, 14; padded 18, 12, 24, 14
    batch = padded(lengths)
    for cost_model, expected in ((None, [2, 3]), ("padded", [2, 3])):
        micro_batches, indices = rearrange_micro_batches(
            batch, 24, dp_group=world_of_one, force_group_size=2, min_num_micro_batch=6,
            cost_model=cost_model, dummy_micro_batches=True,
        )
        assert dummy_source(lengths, 2, cost_model) == expected
        assert indices[4:] == [[], []]
        for micro_batch in micro_batches[4:]:
            assert micro_batch["sample"].tolist() == expected
            dummy_lengths = micro_batch["attention_mask"].sum(-1).tolist()
            assert micro_batch_cost(dummy_lengths, cost_model) <= 24
        assert_plan_invariants(lengths, indices, 24, force_group_size=2, min_num_micro_batch=6,
                               cost_model=cost_model, dummy_micro_batches=True)
    outputs = [mb["sample"] for mb in micro_batches]
    assert restore_dynamic_batch(torch.cat(outputs), indices).tolist() == list(range(8))  # 2 rows per dummy


def test_restore_of_nested_outputs_drops_dummies(world_of_one):
    lengths = [4, 2, 3]
    rows = [torch.arange(n) + 10 * i for i, n in enumerate(lengths)]
    batch = TensorDict({"input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, batch_size=[3])
    micro_batches, indices = rearrange_micro_batches(batch, 8, dp_group=world_of_one, min_num_micro_batch=4,
                                                     dummy_micro_batches=True)
    assert indices[-1] == [] and micro_batches[-1]["input_ids"].offsets().diff().tolist() == [2]
    outputs = [mb["input_ids"] for mb in micro_batches]
    for data in (outputs, torch.nested.as_nested_tensor([r for o in outputs for r in o.unbind()], layout=torch.jagged)):
        restored = restore_dynamic_batch(data, indices)
        assert [r.tolist() for r in restored.unbind()] == [r.tolist() for r in rows]


def test_restore_with_a_wrong_row_count_still_says_so():
    with pytest.raises(ValueError, match="data has 5 rows but batch_idx_list holds 2 indices and 2 dummy"):
        restore_dynamic_batch(torch.zeros(5), [[0], [], [1], []])
    with pytest.raises(ValueError, match="data has 3 rows but batch_idx_list holds 2 indices$"):
        restore_dynamic_batch(torch.zeros(3), [[0], [1]])


def test_synced_dummy_call_uses_two_all_reduces(world_of_one, monkeypatch):
    calls = []
    original = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: calls.append(1) or original(*a, **k))
    plan_micro_batches([5, 3], 8, dp_group=world_of_one, min_num_micro_batch=4, dummy_micro_batches=True)
    assert len(calls) == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(0, 10), min_size=1, max_size=24),
    cap=st.integers(20, 60),
    minimum=st.integers(1, 30),
    divisor=st.sampled_from([None, 1, 2, 3]),
    group=st.sampled_from([1, 2]),
    cost_model=st.sampled_from([None, "padded"]),
)
def test_property_every_guarantee_holds_with_dummies(world_of_one, lengths, cap, minimum, divisor, group, cost_model):
    lengths = lengths[: len(lengths) - len(lengths) % group] or [1] * group
    kwargs = dict(min_num_micro_batch=minimum, num_batches_divided_by=divisor, force_group_size=group, cost_model=cost_model)
    parts = plan_micro_batches(lengths, cap, dp_group=world_of_one, dummy_micro_batches=True, **kwargs)
    assert_plan_invariants(lengths, parts, cap, dummy_micro_batches=True, **kwargs)
    groups = len(lengths) // group
    if len(parts) <= groups:  # not short: exactly the plan without dummies
        assert parts == plan_micro_batches(lengths, cap, dp_group=world_of_one, **kwargs)
    else:  # short: the checker saw one micro-batch per group, then dummies; each dummy fits
        source = dummy_source(lengths, group, cost_model)
        assert micro_batch_cost(np.asarray(lengths)[source].tolist(), cost_model) <= cap
