"""Selecting rows of every kind of TensorDict entry verl builds, and restoring per-sample outputs,
on whichever tensordict is installed (CI runs this file on the oldest and the newest declared).

Every check compares with the row-by-row meaning (``unbind()`` then pick), so a selection that
reorders, drops or mixes rows, or loses the ragged dimension, fails here.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict

from seqbal import rearrange_micro_batches, restore_dynamic_batch
from seqbal.tensordict_compat import select_nested_rows, select_rows

from .invariants import assert_plan_invariants

LENGTHS = [5, 3, 7, 2, 6, 4]


def jagged(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def verl_like_batch(lengths=LENGTHS, seed=0):
    """What verl's no-padding engine path hands to rearrange_micro_batches: jagged ids, mRoPE
    position ids ``(bs, 4, j)`` (ragged dimension 2), per-token embeddings ``(bs, j, d)``, a dense
    per-sample tensor, NonTensorData settings, a NonTensorStack uid and a nested TensorDict."""
    generator = torch.Generator().manual_seed(seed)
    n = len(lengths)
    batch = TensorDict(
        {
            "input_ids": jagged([torch.randint(0, 1000, (k,), generator=generator) for k in lengths]),
            "position_ids": jagged([torch.arange(4 * k).reshape(4, k) + 100 * i for i, k in enumerate(lengths)]),
            "hidden": jagged([torch.randn(k, 3, generator=generator) for k in lengths]),
            "score": torch.randn(n, generator=generator),
            "extra": TensorDict(
                {"reward": torch.arange(2 * n).reshape(n, 2), "mask": jagged([torch.ones(k) * i for i, k in enumerate(lengths)])},
                batch_size=[n],
            ),
        },
        batch_size=[n],
    )
    batch["uid"] = NonTensorStack(*[f"uid-{i}" for i in range(n)])
    batch["max_token_len_per_gpu"] = NonTensorData(12)
    batch["indices"] = NonTensorData(torch.arange(sum(lengths)))  # verl: one tensor for the batch
    return batch


def rows_of(value):
    """The rows of one entry as Python-comparable objects."""
    if isinstance(value, torch.Tensor):
        return list(value.unbind())
    return value.tolist()


def assert_rows_selected(original, selected, index):
    assert selected.batch_size[0] == len(index)
    assert set(selected.keys()) == set(original.keys())
    for key in ("input_ids", "position_ids", "hidden", "score"):
        got, full = selected.get(key), original.get(key)
        if full.is_nested:
            assert got.is_nested and got._ragged_idx == full._ragged_idx, key
        expected = [rows_of(full)[i] for i in index]
        assert len(rows_of(got)) == len(expected)
        for a, b in zip(rows_of(got), expected):
            assert torch.equal(a, b), key
    assert selected.get("uid").tolist() == [f"uid-{i}" for i in index]
    assert selected["max_token_len_per_gpu"] == 12
    assert torch.equal(selected["indices"], original["indices"])
    assert selected["extra"]["reward"].tolist() == original["extra"]["reward"][list(index)].tolist()
    assert [row[0].item() if len(row) else None for row in selected["extra"]["mask"].unbind()] == [
        float(i) for i in index
    ]


@pytest.mark.parametrize("index", [[4, 0, 2], [0], [5, 4, 3, 2, 1, 0], [1, 1]])
def test_select_rows_keeps_every_kind_of_entry(index):
    batch = verl_like_batch()
    assert_rows_selected(batch, select_rows(batch, index), index)


def test_select_rows_accepts_a_tensor_and_copies():
    batch = verl_like_batch()
    picked = select_rows(batch, torch.tensor([3, 1]))
    picked["score"].add_(100.0)
    assert float(batch["score"].max()) < 100.0  # the original is untouched


def test_issue_reproduction_jagged_input_ids_only():
    """The issue's reproduction: raised NotImplementedError on tensordict <= 0.15.2."""
    batch = TensorDict({"input_ids": jagged([torch.arange(n) for n in LENGTHS])}, batch_size=[6])
    micro_batches, parts = rearrange_micro_batches(batch, max_token_len=10)
    assert_plan_invariants(LENGTHS, parts, 10)
    for micro_batch, part in zip(micro_batches, parts):
        assert [len(row) for row in micro_batch["input_ids"].unbind()] == [LENGTHS[i] for i in part]


def test_rearrange_verl_like_batch_and_restore_every_output_kind():
    batch = verl_like_batch()
    micro_batches, parts = rearrange_micro_batches(batch, max_token_len=12, force_group_size=2)
    assert_plan_invariants(LENGTHS, parts, 12, force_group_size=2)
    for micro_batch, part in zip(micro_batches, parts):
        assert_rows_selected(batch, micro_batch, part)
    # Per-sample outputs of each micro-batch, concatenated in micro-batch order, as an engine does.
    order = [i for part in parts for i in part]
    dense = torch.cat([mb["score"] * 2 for mb in micro_batches])
    nested = jagged([row.float() * 2 for mb in micro_batches for row in mb["input_ids"].unbind()])
    mrope = jagged([row for mb in micro_batches for row in mb["position_ids"].unbind()])
    as_td = TensorDict({"score": dense, "log_probs": nested}, batch_size=[len(order)])
    assert torch.equal(restore_dynamic_batch(dense, parts), batch["score"] * 2)
    for got, row in zip(restore_dynamic_batch(nested, parts).unbind(), batch["input_ids"].unbind()):
        assert torch.equal(got, row.float() * 2)
    restored_mrope = restore_dynamic_batch(mrope, parts)
    assert restored_mrope._ragged_idx == 2
    for got, row in zip(restored_mrope.unbind(), batch["position_ids"].unbind()):
        assert torch.equal(got, row)
    restored = restore_dynamic_batch(as_td, parts)
    assert torch.equal(restored["score"], batch["score"] * 2)
    for got, row in zip(restored["log_probs"].unbind(), batch["input_ids"].unbind()):
        assert torch.equal(got, row.float() * 2)


def test_select_nested_rows_matches_unbind_for_a_nested_with_holes():
    # torch.nested.narrow gives per-row lengths shorter than the offsets: a nested tensor with holes.
    rows = torch.arange(18).reshape(3, 6)
    holes = torch.nested.narrow(rows, 1, torch.tensor([1, 0, 2]), torch.tensor([2, 4, 3]), layout=torch.jagged)
    assert holes._lengths is not None
    picked = select_nested_rows(holes, [2, 0])
    assert [row.tolist() for row in picked.unbind()] == [[14, 15, 16], [1, 2]]


def test_select_nested_rows_rejects_out_of_range():
    with pytest.raises(ValueError, match="out of range"):
        select_nested_rows(jagged([torch.arange(2)]), [1])


def test_select_rows_needs_a_batch_dimension():
    with pytest.raises(ValueError, match="empty batch_size"):
        select_rows(TensorDict({"x": torch.zeros(3)}, batch_size=[]), [0])


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    data=st.data(),
)
def test_select_then_restore_is_the_identity(lengths, data):
    batch = verl_like_batch(lengths)
    index = data.draw(st.permutations(range(len(lengths))))
    picked = select_rows(batch, index)
    assert_rows_selected(batch, picked, index)
    restored = restore_dynamic_batch(picked, [index])
    assert_rows_selected(batch, restored, list(range(len(lengths))))
