"""seqbal.memory: the CPU meter against exactly known peaks, the fit, the worst case, the byte
cost model in the planners, calibration's probing rules (budget, out-of-memory), and the file."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbal
import seqbal.memory
from seqbal.cost import CostModel, MemoryCost
from seqbal.memory import Calibration, MemoryModel, calibrate, default_probes, features, fit, measure_peak

TRUE = MemoryModel(fixed=5e6, per_sequence=3e3, per_token=4e4, per_token_squared=20.0, per_longest=1e3,
                   per_longest_squared=6.0)


# --- the meter ---------------------------------------------------------------------------------


def test_cpu_meter_counts_the_peak_of_live_bytes_exactly():
    torch = pytest.importorskip("torch")

    def step():
        a = torch.empty(1000, dtype=torch.uint8)
        b = torch.empty(3000, dtype=torch.uint8)
        del a  # live 3000
        c = torch.empty(500, dtype=torch.uint8)  # live 3500: the peak was 4000, before the free
        del b, c
        d = torch.empty(3999, dtype=torch.uint8)  # alone: below the peak
        del d

    assert measure_peak(step, "cpu") == 4000


def test_cpu_meter_excludes_what_was_live_before_and_counts_operator_outputs():
    torch = pytest.importorskip("torch")
    x = torch.ones(1000, dtype=torch.float32)  # 4000 bytes, live before the step: not counted

    def step():
        y = x * 2  # 4000
        z = y + 1  # 8000 live
        del y
        w = z.to(torch.float64)  # 4000 + 8000 = 12000 live: the peak
        del z, w

    assert measure_peak(step, "cpu") == 12000


def test_cpu_meter_prints_nothing_of_its_own_and_keeps_the_steps_output(capfd):
    torch = pytest.importorskip("torch")
    import os

    capfd.readouterr()
    measure_peak(lambda: torch.ones(100) * 2, "cpu")
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)  # torch's profiler prints USDT start/stop lines unless silenced

    def noisy():
        os.write(2, b"the step's own line\n")
        return torch.ones(10) * 2

    measure_peak(noisy, "cpu")
    out, err = capfd.readouterr()
    assert err == "the step's own line\n" and out == ""


def test_meter_rejects_other_devices():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="meters CUDA and CPU"):
        measure_peak(lambda: None, "meta")


# --- the fit and the worst case -----------------------------------------------------------------


def test_fit_recovers_a_model_it_can_express():
    probes = [list(p) for t in (64, 256, 1024, 4096) for p in default_probes(t).values()]
    probes += [[300, 200, 100], [700] * 3, [50] * 40]
    rows = np.array([features(p) for p in probes])
    peaks = rows @ TRUE.coefficients
    coefficients = fit(rows, peaks)
    assert (coefficients >= 0).all()
    assert np.allclose(rows @ coefficients, peaks, rtol=1e-9)


def test_fit_never_returns_a_negative_coefficient():
    rng = np.random.default_rng(3)
    rows = np.array([features(rng.integers(1, 500, rng.integers(1, 9)).tolist()) for _ in range(12)])
    peaks = rng.uniform(1e6, 1e8, 12)  # noise: no model fits it, NNLS still stays >= 0
    assert (fit(rows, peaks) >= 0).all()


def _brute_worst(model: MemoryModel, tokens: int, low: int, high: int) -> int:
    """Largest prediction over every multiset of lengths in [low, high] with sum <= tokens."""
    best = 0

    def walk(prefix: list[int], smallest: int, left: int) -> None:
        nonlocal best
        if prefix:
            best = max(best, model.predict(prefix))
        for s in range(smallest, min(high, left) + 1):
            walk(prefix + [s], s, left - s)

    walk([], low, tokens)
    return best


@settings(max_examples=40, deadline=None)
@given(
    coefficients=st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0, 40.0]), min_size=6, max_size=6),
    tokens=st.integers(1, 16), low=st.integers(1, 4), span=st.integers(0, 10), any_lengths=st.booleans(),
)
def test_worst_case_is_the_largest_prediction_of_any_micro_batch(coefficients, tokens, low, span, any_lengths):
    model = MemoryModel.from_coefficients(coefficients)
    length_range = None if any_lengths else (low, low + span)
    lo, hi = (1, tokens) if any_lengths else (low, low + span)
    worst, example = model.worst_case(tokens, length_range)
    assert worst == _brute_worst(model, tokens, lo, hi)
    if example:
        assert sum(example) <= tokens and lo <= min(example) and max(example) <= hi
        assert model.predict(example) == worst


@pytest.mark.parametrize("length_range", [None, (20, 900)])
def test_max_token_len_is_the_largest_cap_within_the_byte_cap(length_range):
    cap_bytes = 400 << 20
    cap = TRUE.max_token_len(cap_bytes, length_range)
    assert TRUE.worst_case(cap, length_range)[0] <= cap_bytes < TRUE.worst_case(cap + 1, length_range)[0]


def test_no_token_fits_gives_zero():
    assert TRUE.max_token_len(1000) == 0


# --- the byte cost model in the planners ---------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=12))
def test_cost_model_never_predicts_less_than_the_model(lengths):
    cost = TRUE.cost_model()
    assert TRUE.predict(lengths) <= cost.cost(lengths)
    if len(lengths) == 1:  # the folding is exact for one sequence (two roundings up apart)
        assert cost.cost(lengths) <= TRUE.predict(lengths) + 2


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 2000), min_size=1, max_size=60), st.integers(1, 3))
def test_plans_under_the_byte_cost_keep_every_prediction_within_the_cap(lengths, dp):
    cal = Calibration(TRUE, 600 << 20, margin=0.1)
    parts = seqbal.plan_micro_batches(lengths, cal.byte_cap, cost_model=cal.cost_model)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(cal.predict([lengths[i] for i in p]) <= cal.byte_cap for p in parts)
    if len(lengths) >= dp:
        schedule = seqbal.build_dp_schedule(lengths, max_token_len=cal.byte_cap, dp_size=dp, cost_model=cal.cost_model)
        for rank_parts in schedule.micro_batches:
            assert all(cal.predict([lengths[i] for i in p]) <= cal.byte_cap for p in rank_parts if p)


def test_a_sample_over_the_byte_cap_is_named_with_its_bytes():
    cal = Calibration(TRUE, 100 << 20, margin=0.1)
    too_long = 3000
    with pytest.raises(ValueError, match=r"sample 1 has 3000 tokens \(predicted \d+ bytes.*exceeds max_token_len"):
        seqbal.plan_micro_batches([10, too_long], cal.byte_cap, cost_model=cal.cost_model)


def test_the_default_cost_models_are_unchanged_by_the_memory_field():
    assert CostModel().sample_costs(np.array([5, 3])).tolist() == [5, 3]
    assert repr(CostModel(round_to=4)) == "CostModel(round_to=4)"
    memory = MemoryCost(fixed=7, per_token=1.5)
    model = CostModel(memory=memory)
    assert eval(repr(model)) == model  # noqa: S307 - the repr promise
    assert model.cost([2, 3]) == 7 + 3 + 5 and model.cost([]) == 0
    assert model.group_costs(np.array([2, 3, 4, 4]), 2).tolist() == [15, 19]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(padded=True, memory=MemoryCost()), "memory applies to the token cost"),
        (dict(pack_round_to=8, memory=MemoryCost()), "memory applies to the token cost"),
        (dict(memory=(1, 2, 3)), "memory must be None or a seqbal.cost.MemoryCost"),
    ],
)
def test_memory_cost_model_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CostModel(**kwargs)


def test_memory_cost_rejects_negative_or_infinite_coefficients():
    with pytest.raises(ValueError, match="per_token must be a finite number >= 0"):
        MemoryCost(per_token=-1.0)
    with pytest.raises(ValueError, match="per_token_squared must be a finite number >= 0"):
        MemoryCost(per_token_squared=float("inf"))


# --- calibration's probing rules ----------------------------------------------------------------


class _FakeDevice:
    """A step whose peak is TRUE's prediction, and which runs out of memory above ``limit``."""

    def __init__(self, limit: float = float("inf")) -> None:
        self.limit, self.ran, self.last = limit, [], 0

    def step(self, lengths):
        peak = TRUE.predict(lengths)
        self.ran.append(list(lengths))
        if peak > self.limit:
            raise MemoryError(f"tried to allocate {peak} bytes")
        self.last = peak

    def meter(self, run):
        run()
        return self.last


def test_calibration_recovers_the_model_and_never_probes_over_the_budget():
    pytest.importorskip("torch")  # out-of-memory types are looked up in torch
    device = _FakeDevice()
    budget = 2 << 30
    cal = calibrate(device.step, budget, meter=device.meter, margin=0.1)
    assert all(TRUE.predict(p) <= budget for p in device.ran)
    metered = [p for p in cal.probes if p.peak_bytes]
    assert len(metered) >= 8 and max(abs(e) for e in cal.probe_errors()) < 1e-6
    lengths = [900, 300, 300, 64]
    assert abs(cal.predict(lengths) / TRUE.predict(lengths) - 1) < 1e-6
    cap = cal.max_token_len
    assert cap == TRUE.max_token_len(cal.byte_cap) or abs(cap - TRUE.max_token_len(cal.byte_cap)) <= 1


def test_an_out_of_memory_probe_is_recorded_and_the_fit_goes_on():
    pytest.importorskip("torch")
    device = _FakeDevice(limit=200 << 20)  # the device is smaller than the budget says
    with pytest.warns(seqbal.memory.ExtrapolationWarning):
        cal = calibrate(device.step, 2 << 30, meter=device.meter)
    failed = [p for p in cal.probes if p.peak_bytes is None]
    assert failed and all(p.error.startswith("out of memory: MemoryError") for p in failed)
    assert max(abs(e) for e in cal.probe_errors()) < 1e-6  # the metered ones still fit exactly
    assert "ran out of memory" in cal.explain()


def test_explicit_probes_predicted_over_the_budget_are_skipped():
    pytest.importorskip("torch")
    device = _FakeDevice()
    small = [[64], [32, 32], [128], [16] * 8, [256, 64], [512]]
    with pytest.warns(seqbal.memory.ExtrapolationWarning):  # the probes chosen stop at 512 tokens
        cal = calibrate(device.step, 400 << 20, probes=small + [[20000]], meter=device.meter)
    assert [20000] not in device.ran and cal.probes[-1].error.startswith("skipped: predicted")


def test_calibration_needs_two_probes_under_the_budget():
    pytest.importorskip("torch")
    device = _FakeDevice(limit=0)
    with pytest.raises(ValueError, match="calibration metered 0 probe"):
        calibrate(device.step, 2 << 30, meter=device.meter)


def test_user_lengths_bound_the_probes_and_the_worst_case():
    pytest.importorskip("torch")
    device = _FakeDevice()
    lengths = [40, 80, 300, 1200, 60]
    cal = calibrate(device.step, 1 << 30, lengths=lengths, meter=device.meter)
    assert max(max(p) for p in device.ran) <= 1200 and cal.length_range == (40, 1200)
    assert any(p.shape == "sampled" for p in cal.probes)
    worst, example = cal.worst_case()
    assert max(example) <= 1200 and worst <= cal.byte_cap


@pytest.mark.parametrize("bad, match", [
    (dict(memory_budget=0), "memory_budget must be a positive int"),
    (dict(margin=1.0), "margin must be a fraction"),
    (dict(probes=1), "probes must be at least 2"),
])
def test_calibrate_argument_errors(bad, match):
    pytest.importorskip("torch")
    device = _FakeDevice()
    arguments = dict(memory_budget=1 << 30, margin=0.1, probes=24)
    arguments.update(bad)
    with pytest.raises(ValueError, match=match):
        calibrate(device.step, arguments.pop("memory_budget"), meter=device.meter, **arguments)


# --- the file ------------------------------------------------------------------------------------


def test_calibration_round_trips_through_its_file(tmp_path):
    cal = Calibration(TRUE, 3 << 30, margin=0.15, length_range=(10, 4000))
    path = tmp_path / "cal.json"
    cal.save(path)
    loaded = Calibration.load(path)
    assert loaded == cal and loaded.max_token_len == cal.max_token_len
    data = json.loads(path.read_text())
    assert data["max_token_len"] == cal.max_token_len
    path.write_text(json.dumps({**data, "format": "other"}))
    with pytest.raises(ValueError, match="not a seqbal calibration"):
        Calibration.load(path)


def test_rebudget_moves_the_cap_with_the_budget():
    cal = Calibration(TRUE, 1 << 30)
    assert cal.rebudget(2 << 30).max_token_len > cal.max_token_len
    assert cal.rebudget(lengths=[10, 500]).length_range == (10, 500)


def test_explain_names_the_cap_the_worst_micro_batch_and_the_budget():
    cal = Calibration(TRUE, 1 << 30, margin=0.1, length_range=(100, 2000))
    text = cal.explain()
    cap = cal.max_token_len
    assert text.startswith(f"max_token_len {cap}:") and "x 2000" in text and "1,024.0 MiB" in text


def test_every_vertex_candidate_is_tried_for_small_inputs():
    # exhaustive over every length multiset for T <= 10 on one fixed model: a regression guard
    model = MemoryModel(fixed=1.0, per_sequence=50.0, per_token=1.0, per_token_squared=0.5)
    for tokens, (low, high) in itertools.product(range(1, 11), [(1, 3), (2, 5), (1, 10)]):
        assert model.worst_case(tokens, (low, high))[0] == _brute_worst(model, tokens, low, high)
