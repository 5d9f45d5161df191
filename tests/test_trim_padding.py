"""trim_padding: micro-batches cut to their own padding window, and outputs put back."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from seqbal import (
    CostModel,
    padding_window,
    padding_windows,
    rearrange_micro_batches,
    restore_dynamic_batch,
    trim_to_window,
)

from .invariants import assert_plan_invariants


def padded_batch(lengths: list[int], width: int, side: str) -> TensorDict:
    positions = torch.arange(width)[None, :]
    lengths_t = torch.tensor(lengths)[:, None]
    mask = positions < lengths_t if side == "right" else positions >= width - lengths_t
    ids = (torch.arange(len(lengths))[:, None] * 100 + positions + 1) * mask
    return TensorDict(
        {
            "input_ids": ids,
            "attention_mask": mask.long(),
            "extra": TensorDict({"position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}, batch_size=[len(lengths)]),
            "score": torch.arange(len(lengths)).float(),
            "responses": torch.ones(len(lengths), 3, dtype=torch.long),
        },
        batch_size=[len(lengths)],
    )


@pytest.mark.parametrize("side", ["left", "right"])
def test_trimmed_width_is_the_longest_sample_and_the_padded_cap_holds(side: str) -> None:
    lengths = [9, 2, 3, 8, 2, 2, 1, 7]
    batch = padded_batch(lengths, 12, side)
    micro_batches, indices = rearrange_micro_batches(batch, 16, cost_model="padded", trim_padding=True)
    assert_plan_invariants(lengths, indices, 16, cost_model="padded")
    for micro_batch, part in zip(micro_batches, indices):
        longest = max(lengths[i] for i in part)
        assert micro_batch["input_ids"].shape == (len(part), longest)
        assert micro_batch["attention_mask"].shape[1] == micro_batch["extra", "position_ids"].shape[1] == longest
        assert micro_batch["responses"].shape == (len(part), 3)  # another width: untouched
        assert micro_batch.numel() * micro_batch["input_ids"].shape[1] <= 16  # the memory the cap bounds
        # no real token was cut
        assert int(micro_batch["attention_mask"].sum()) == sum(lengths[i] for i in part)
    untrimmed, _ = rearrange_micro_batches(batch, 16, cost_model="padded")
    assert all(u["input_ids"].shape[1] == 12 for u in untrimmed)  # off by default, as in verl


@pytest.mark.parametrize("side", ["left", "right"])
def test_restore_puts_trimmed_outputs_back_in_place(side: str) -> None:
    lengths = [9, 2, 3, 8, 2, 2, 1, 7]
    batch = padded_batch(lengths, 12, side)
    micro_batches, indices = rearrange_micro_batches(batch, 16, cost_model="padded", trim_padding=True)
    outputs = [mb["input_ids"].float() * 2 for mb in micro_batches]  # a per-token output, trimmed width
    restored = restore_dynamic_batch(outputs, indices, windows=padding_windows(batch, indices), width=12)
    assert torch.equal(restored, batch["input_ids"].float() * 2)


def test_both_sides_padded_keep_every_real_column() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    assert padding_window(mask) == (1, 5)
    batch = TensorDict({"attention_mask": mask, "input_ids": mask * 5}, batch_size=[2])
    trimmed = trim_to_window(batch)
    assert trimmed["input_ids"].tolist() == [[5, 5, 0, 0], [0, 5, 5, 5]]
    assert batch["input_ids"].shape == (2, 5)  # the input is not changed
    assert padding_window(torch.zeros(2, 3)) == (0, 0)


def test_trim_does_not_touch_the_callers_nested_tensordict() -> None:
    batch = padded_batch([2, 1], 4, "right")
    trimmed = trim_to_window(batch)
    assert trimmed["extra", "position_ids"].shape == (2, 2)
    assert batch["extra", "position_ids"].shape == (2, 4)


def test_nested_input_ids_have_nothing_to_trim() -> None:
    ids = torch.nested.as_nested_tensor([torch.arange(n) for n in [5, 3, 7, 2]], layout=torch.jagged)
    batch = TensorDict({"input_ids": ids}, batch_size=[4])
    micro_batches, indices = rearrange_micro_batches(batch, 10, trim_padding=True)
    assert_plan_invariants([5, 3, 7, 2], indices, 10)
    assert [mb["input_ids"].offsets().diff().tolist() for mb in micro_batches] == [
        [[5, 3, 7, 2][i] for i in part] for part in indices
    ]


def test_restore_of_a_list_needs_windows_and_matching_widths() -> None:
    with pytest.raises(ValueError, match="needs windows="):
        restore_dynamic_batch([torch.zeros(1, 2), torch.zeros(1, 3)], [[0], [1]])
    with pytest.raises(ValueError, match=r"output 0 has shape \(1, 3\), but its window \(0, 2\) needs width 2"):
        restore_dynamic_batch([torch.zeros(1, 3)], [[0]], windows=[(0, 2)], width=4)
    with pytest.raises(ValueError, match="got 1 outputs, 2 windows"):
        restore_dynamic_batch([torch.zeros(1, 2)], [[0]], windows=[(0, 2), (0, 1)], width=4)


def test_padded_cost_with_rounding_still_bounds_trimmed_memory() -> None:
    lengths = [9, 2, 3, 8, 2, 2, 1, 7]
    batch = padded_batch(lengths, 12, "right")
    model = CostModel(padded=True, round_to=4)
    micro_batches, indices = rearrange_micro_batches(batch, 24, cost_model=model, trim_padding=True)
    assert_plan_invariants(lengths, indices, 24, cost_model=model)
    for micro_batch in micro_batches:
        width = micro_batch["input_ids"].shape[1]
        assert micro_batch.numel() * (-(-width // 4) * 4) <= 24  # padded to a multiple of 4: still within
