"""trim_padding: micro-batches cut to their own padding window, and outputs put back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
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


# ------------------------------------------------------------------ issue 17.1: the sequence axis


def _mrope_batch(rows: list[list[int]]) -> TensorDict:
    mask = torch.tensor(rows)
    width = mask.shape[1]
    return TensorDict(
        {
            "attention_mask": mask,
            "input_ids": mask * 7,
            "position_ids": torch.arange(width).expand(len(rows), 4, width).clone(),  # mRoPE (bs, 4, seq)
            "hidden": torch.ones(len(rows), width, 3),  # (bs, seq, d)
        },
        batch_size=[len(rows)],
    )


@pytest.mark.parametrize("side", ["left", "right"])
def test_mrope_position_ids_are_trimmed_on_their_sequence_axis(side: str) -> None:
    rows = [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    if side == "left":
        rows = [row[::-1] for row in rows]
    batch = _mrope_batch(rows)
    micro_batches, indices = rearrange_micro_batches(batch, 100, cost_model="padded", trim_padding=True)
    assert indices == [[0, 1]]
    (micro_batch,) = micro_batches
    start, stop = padding_window(batch["attention_mask"])
    assert stop - start == 3
    assert micro_batch["attention_mask"].shape == (2, 3)
    assert micro_batch["position_ids"].shape == (2, 4, 3)  # the channels stay, the sequence is cut
    assert torch.equal(micro_batch["position_ids"], batch["position_ids"][:, :, start:stop])
    assert torch.equal(micro_batch["hidden"], batch["hidden"][:, start:stop])


def test_mask_as_wide_as_the_mrope_channels_is_refused_naming_the_key() -> None:
    batch = _mrope_batch([[1, 1, 1, 0], [1, 1, 0, 0]])  # width 4 = the 4 channels: which axis?
    with pytest.raises(ValueError, match=r"trim_padding cannot tell which axis of 'position_ids' \(shape \(2, 4, 4\)\)"):
        rearrange_micro_batches(batch, 100, cost_model="padded", trim_padding=True)
    with pytest.raises(ValueError, match="'position_ids'"):
        trim_to_window(batch)
    without_trim, _ = rearrange_micro_batches(batch, 100, cost_model="padded")  # no trimming, no question
    assert without_trim[0]["position_ids"].shape == (2, 4, 4)


def test_square_entry_in_a_nested_tensordict_is_refused_before_planning(monkeypatch) -> None:
    from seqbal.plan import local as plan_module  # the module that calls _local_plan

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    batch = TensorDict(
        {"attention_mask": mask, "extra": TensorDict({"bias": torch.zeros(2, 3, 3)}, batch_size=[2])}, batch_size=[2]
    )
    monkeypatch.setattr(plan_module, "_local_plan", lambda *a, **k: pytest.fail("planned before refusing"))
    with pytest.raises(ValueError, match=r"\('extra', 'bias'\)"):
        rearrange_micro_batches(batch, 100, trim_padding=True)


# ------------------------------------------------------------------ issue 17.2: the window is what costs


def test_two_sided_padding_is_capped_by_its_window() -> None:
    # each row holds one or two tokens, at opposite ends: any two rows span all 9 columns
    mask = torch.zeros(3, 9, dtype=torch.long)
    mask[0, 0] = mask[1, 8] = mask[2, 0] = mask[2, 8] = 1
    batch = TensorDict({"attention_mask": mask, "input_ids": mask * 3}, batch_size=[3])
    micro_batches, indices = rearrange_micro_batches(batch, 16, cost_model="padded", trim_padding=True)
    assert_plan_invariants([1, 1, 2], indices, 16, cost_model="padded")
    assert all(mb.numel() * mb["attention_mask"].shape[1] <= 16 for mb in micro_batches)


def test_a_sample_whose_window_exceeds_the_cap_is_an_error_naming_the_window() -> None:
    mask = torch.zeros(2, 12, dtype=torch.long)
    mask[0, [0, 11]] = 1  # 2 tokens, 12 columns apart
    mask[1, 0] = 1
    batch = TensorDict({"attention_mask": mask}, batch_size=[2])
    with pytest.raises(ValueError, match=r"sample 0 has 2 tokens spread over a window of 12 columns.*exceeds max_token_len=10"):
        rearrange_micro_batches(batch, 10, cost_model="padded", trim_padding=True)
    assert len(rearrange_micro_batches(batch, 10, cost_model="padded")[1]) == 1  # untrimmed: 2 x 2 tokens


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 15), st.integers(0, 15), st.lists(st.booleans(), min_size=16, max_size=16)),
        min_size=1,
        max_size=14,
    ),
    group_size=st.sampled_from([1, 2]),
    round_to=st.sampled_from([1, 3]),
    cap_extra=st.integers(0, 40),
    divisor=st.sampled_from([None, 2]),
)
def test_trimmed_padded_micro_batches_never_exceed_the_cap(rows, group_size, round_to, cap_extra, divisor) -> None:
    """Random masks with holes and padding on both sides: samples x trimmed width (rounded) is
    within the cap for every micro-batch, and no token is lost."""
    if len(rows) % group_size:
        rows = rows + rows[: group_size - len(rows) % group_size]
    mask = torch.zeros(len(rows), 16, dtype=torch.long)
    for i, (a, b, holes) in enumerate(rows):
        low, high = min(a, b), max(a, b)
        mask[i, low : high + 1] = torch.tensor(holes[low : high + 1], dtype=torch.long)
    batch = TensorDict({"attention_mask": mask, "input_ids": mask * 5}, batch_size=[len(rows)])
    model = CostModel(padded=True, round_to=round_to)
    starts_stops = [padding_window(mask[i : i + group_size]) for i in range(0, len(rows), group_size)]
    widest = max(-(-(stop - start) // round_to) * round_to for start, stop in starts_stops)
    cap = max(group_size * widest, 1) + cap_extra
    try:
        micro_batches, indices = rearrange_micro_batches(
            batch, cap, cost_model=model, trim_padding=True, force_group_size=group_size, num_batches_divided_by=divisor
        )
    except ValueError as error:  # only a count the divisor cannot reach
        assert divisor == 2 and "Cannot satisfy max_token_len" in str(error), error
        return
    lengths = mask.sum(-1).tolist()
    assert_plan_invariants(lengths, indices, cap, cost_model=model, force_group_size=group_size, num_batches_divided_by=divisor)
    for micro_batch, part in zip(micro_batches, indices):
        width = micro_batch["attention_mask"].shape[1]
        assert len(part) * (-(-width // round_to) * round_to) <= cap, (part, width, cap)
        assert int(micro_batch["attention_mask"].sum()) == sum(lengths[i] for i in part)


# ------------------------------------------------------------------ issue 17.8: bad inputs of the helpers


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: padding_window(None), "attention_mask must be a 2-D"),
        (lambda: padding_window(torch.ones(3)), r"got shape \(3,\)"),
        (lambda: trim_to_window(None), "trim_to_window needs a TensorDict with an attention_mask"),
        (lambda: restore_dynamic_batch(None, [[0]]), "data must be a tensor, a TensorDict or a list"),
        (lambda: restore_dynamic_batch(torch.zeros(2), None), "batch_idx_list must be a list of index lists"),
        (lambda: restore_dynamic_batch(torch.tensor(3.0), [[0]]), "without dimensions"),
        (lambda: restore_dynamic_batch([None], [[0]], windows=[(0, 1)], width=2), "output 0 must be a dense tensor"),
        (lambda: padding_windows(None, [[0]]), "padding_windows needs a TensorDict"),
    ],
    ids=["window-none", "window-1d", "trim-none", "restore-none", "restore-no-indices", "restore-0d", "restore-list", "windows-none"],
)
def test_helpers_raise_value_errors_on_bad_input(call, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        call()


def test_micro_batches_and_restore_keep_the_batch_dim_names() -> None:
    batch = padded_batch([3, 1, 2], 4, "right")
    batch.rename_("batch")
    trimmed, _ = rearrange_micro_batches(batch, 3, trim_padding=True)
    assert [mb.names for mb in trimmed] == [["batch"]] * len(trimmed)
    micro_batches, indices = rearrange_micro_batches(batch, 3)
    assert [mb.names for mb in micro_batches] == [["batch"]] * len(micro_batches)
    assert restore_dynamic_batch(torch.cat(micro_batches), indices).names == ["batch"]


@settings(max_examples=60, deadline=None)
@given(
    windows=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=12),
    cap_extra=st.integers(0, 30),
    round_to=st.sampled_from([1, 4]),
)
def test_windowed_plan_fits_at_every_count_up_to_the_samples(windows, cap_extra, round_to) -> None:
    """What the agreement relies on: a rank's windowed plan splits into a cap-respecting one at
    any larger count (a peer may need more micro-batches), up to its number of samples."""
    from seqbal.partition.windows import window_cost
    from seqbal.plan import _local_plan

    starts = np.array([min(a, b) for a, b in windows], dtype=np.int64)
    stops = np.array([max(a, b) + 1 for a, b in windows], dtype=np.int64)
    lengths = stops - starts  # whole windows of tokens: only their union matters here
    model = CostModel(padded=True, round_to=round_to)
    cap = int(-(-lengths.max() // round_to) * round_to) + cap_extra
    plan = _local_plan(lengths, cap, None, None, 1, model, (starts, stops))
    for count in range(plan.count, len(lengths) + 1):
        parts = plan.partition_at(count)
        assert parts is not None and len(parts) == count, count
        assert sorted(i for part in parts for i in part) == list(range(len(lengths)))
        assert all(part and window_cost(part, starts, stops, 1, round_to) <= cap for part in parts)
        assert all(map(plan.fits, parts))
