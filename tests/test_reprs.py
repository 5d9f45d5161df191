"""The reprs users see in a debugger, a log line or a notebook: short, and saying what matters."""

from __future__ import annotations

import numpy as np
import pytest

from seqbal import CostModel, build_dp_schedule


@pytest.mark.parametrize(
    ("model", "text"),
    [
        (CostModel(), "CostModel()"),
        (CostModel(padded=True), "CostModel(padded=True)"),
        (CostModel(round_to=8, pack_round_to=16), "CostModel(round_to=8, pack_round_to=16)"),
        (CostModel(padded=True, round_to=64), "CostModel(padded=True, round_to=64)"),
    ],
)
def test_cost_model_repr_is_short_and_evaluates_to_the_model(model: CostModel, text: str) -> None:
    assert repr(model) == text
    assert eval(repr(model), {"CostModel": CostModel}) == model  # noqa: S307 - the point of the test
    assert str(model) != repr(model)  # str stays the sentence used in messages


def test_dp_schedule_repr_names_its_shape_not_its_micro_batches() -> None:
    lengths = np.random.default_rng(0).integers(1, 3000, 800)
    schedule = build_dp_schedule(lengths, 8, 4096)
    text = repr(schedule)
    assert text == (f"<DPSchedule dp_size=8 num_micro_batches={schedule.num_micro_batches} max_token_len=4096 "
                    f"samples=800 tokens={int(lengths.sum())}>")
    assert len(text) < 120
