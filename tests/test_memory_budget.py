"""seqbal.memory at the budget: probes climb to the budget's scale, a true peak that departs from
the fitted form by up to the margin never takes a planned micro-batch over the budget (token
cap and byte cost alike), plans past 2x the probes warn, and the calibration's dead ends are
ValueErrors that name their cause. The devices here are simulated: a step whose peak is a
known function of the lengths, and which runs out of memory above its capacity."""

from __future__ import annotations

import math
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqbal
from seqbal.memory import Calibration, ExtrapolationWarning, MemoryModel, calibrate

pytest.importorskip("torch")  # out-of-memory types are looked up in torch


class Device:
    """A step whose peak is ``fixed + (form(lengths) - fixed) x (1 + ripple(lengths))``: what
    it allocates departs from the fitted form by ``ripple`` (at most the margin either way),
    what it holds before it starts (parameters, optimizer state) does not. It runs out of
    memory above ``capacity`` bytes; ``meter`` reads its peak."""

    def __init__(self, form: MemoryModel, ripple=lambda lengths: 0.0, capacity: float = math.inf) -> None:
        self.form, self.ripple, self.capacity = form, ripple, capacity
        self.ran: list[list[int]] = []
        self.last = 0

    def peak(self, lengths) -> int:
        fixed = self.form.fixed
        return int(fixed + (self.form.predict(lengths) - fixed) * (1.0 + self.ripple(lengths)))

    def step(self, lengths) -> None:
        peak = self.peak(lengths)
        self.ran.append(list(lengths))
        if peak > self.capacity:
            raise MemoryError(f"tried to allocate {peak} bytes")
        self.last = peak

    def meter(self, run) -> int:
        run()
        return self.last


def ripple_of(kind: str, amplitude: float, frequency: float, phase: float):
    """A departure from the fitted form of at most ``amplitude`` either way: a wave over the
    micro-batch's tokens, its longest sequence or its count, or one value per micro-batch."""
    if kind == "tokens":
        return lambda lengths: amplitude * math.sin(frequency * math.log2(sum(lengths)) + phase)
    if kind == "longest":
        return lambda lengths: amplitude * math.sin(frequency * math.log2(max(lengths)) + phase)
    if kind == "count":
        return lambda lengths: amplitude * math.sin(frequency * math.log2(len(lengths)) + phase)
    salt = int(phase * 1e6)

    def scattered(lengths):  # a fixed pseudo-random value in [-1, 1] for each micro-batch
        digest = zlib.crc32(np.asarray(sorted(lengths), dtype=np.int64).tobytes(), salt)
        return amplitude * (digest / 2 ** 31 - 1.0)

    return scattered


def planned(cal: Calibration, batch: list[int]) -> list[list[int]]:
    """Every micro-batch of both routes over ``batch`` (samples over a route's cap alone left
    out: no plan of that route can hold them), and the token cap's own worst micro-batch."""
    out = [cal.worst_case()[1]]
    by_tokens = [s for s in batch if s <= cal.max_token_len]
    by_bytes = [s for s in batch if cal.cost_model.cost([s]) <= cal.byte_cap]
    if by_tokens:
        out += [[by_tokens[i] for i in part] for part in seqbal.plan_micro_batches(by_tokens, cal.max_token_len)]
    if by_bytes:
        out += [[by_bytes[i] for i in part]
                for part in seqbal.plan_micro_batches(by_bytes, cal.byte_cap, cost_model=cal.cost_model)]
    return out


forms = st.fixed_dictionaries({
    "per_sequence": st.sampled_from([0.0, 1e3, 3e4]),
    "per_token": st.floats(2e3, 2e5),
    "per_token_squared": st.sampled_from([0.0, 0.5, 4.0, 40.0]),
    "per_longest": st.sampled_from([0.0, 1e4]),
    "per_longest_squared": st.sampled_from([0.0, 2.0, 20.0]),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    coefficients=forms,
    fixed_share=st.sampled_from([0.0, 0.05, 0.3, 0.6]),
    budget_tokens=st.integers(2048, 65536),
    margin=st.sampled_from([0.05, 0.1, 0.2]),
    amplitude_share=st.sampled_from([0.25, 0.5, 1.0]),
    kind=st.sampled_from(["tokens", "longest", "count", "scattered"]),
    frequency=st.floats(0.5, 8.0),
    phase=st.floats(0.0, 2 * math.pi),
    use_lengths=st.booleans(),
    seed=st.integers(0, 2 ** 16),
)
def test_no_planned_micro_batch_peaks_over_the_budget(coefficients, fixed_share, budget_tokens, margin,
                                                      amplitude_share, kind, frequency, phase, use_lengths, seed):
    rng = np.random.default_rng(seed)
    growth = MemoryModel(**coefficients)
    if use_lengths:  # a real-looking spread: many short, a long tail
        lengths = np.minimum(rng.lognormal(6.0, 1.0, 300).astype(int) + 16, budget_tokens).tolist()
        length_range = (min(lengths), max(lengths))
    else:
        lengths, length_range = None, None
    worst_growth = growth.worst_case(budget_tokens, length_range)[0]
    fixed = fixed_share / (1 - fixed_share) * worst_growth
    form = MemoryModel(fixed=fixed, **coefficients)
    budget = int(form.worst_case(budget_tokens, length_range)[0])  # budget_tokens' worth of memory
    device = Device(form, ripple_of(kind, amplitude_share * margin, frequency, phase), capacity=budget)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExtrapolationWarning)
        cal = calibrate(device.step, budget, lengths=lengths, margin=margin, meter=device.meter)
    batch = lengths if lengths is not None else rng.integers(1, cal.max_token_len + 1, 200).tolist()
    worst = max(device.peak(mb) / budget for mb in planned(cal, batch))
    assert worst <= 1.0, (worst, cal.explain())
    # plans reach at most 2x past the largest probe, or the calibration said so
    assert cal.extrapolation()["factor"] <= 2.0 or any(w.category is ExtrapolationWarning for w in caught)


def test_a_ripple_inside_the_margin_no_longer_takes_a_plan_to_five_times_the_budget():
    """A peak 8% off the fitted form, in a wave over log2(tokens), at a budget of 4,027 tokens'
    worth under a large fixed overhead: probes that stopped at 64 tokens fitted a cap of 108,564
    tokens, whose worst micro-batch truly peaked at 9.7x the budget (4.9x on the byte cost)."""
    form = MemoryModel(fixed=1e8, per_sequence=1e3, per_token=15126.555899756388, per_token_squared=0.9100073683930355)
    ripple = ripple_of("tokens", 0.08, 1.1562770050472473, 4.236917793676277)
    budget = form.predict([4027])
    device = Device(form, ripple, capacity=budget)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExtrapolationWarning)
        cal = calibrate(device.step, budget, meter=device.meter)
    assert cal.max_token_len < 4027  # the cap of a budget of 4,027 tokens' worth, within the margin
    batch = np.random.default_rng(0).integers(1, 4027, 300).tolist()
    assert max(device.peak(mb) for mb in planned(cal, batch)) <= budget
    assert max(sum(p.lengths) for p in cal.probes if p.peak_bytes) >= cal.max_token_len


# --- the probes reach the budget -----------------------------------------------------------------

QUADRATIC = MemoryModel(fixed=5e6, per_sequence=3e3, per_token=4e4, per_token_squared=20.0, per_longest=1e3,
                        per_longest_squared=6.0)


@pytest.mark.parametrize("budget_mib", [64, 1024, 16384])
@pytest.mark.parametrize("lengths", [None, [40, 80, 300, 1200, 60] * 50])
def test_probes_climb_to_the_budget_within_the_probe_count(budget_mib, lengths):
    device = Device(QUADRATIC)
    budget = budget_mib << 20
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExtrapolationWarning)
        cal = calibrate(device.step, budget, lengths=lengths, meter=device.meter)
    assert len(cal.probes) <= 24
    top = max(p.peak_bytes for p in cal.probes if p.peak_bytes)
    most = max(sum(p.lengths) for p in cal.probes if p.peak_bytes)
    assert top <= budget * (1 - cal.margin)  # never past the budget less the margin
    assert top >= cal.byte_cap or most == cal.lengths_total  # past the plans, or every length at once
    assert all(QUADRATIC.predict(p) <= budget * (1 - cal.margin) for p in device.ran)
    assert cal.extrapolation()["factor"] <= 2.0
    assert "the largest probe ran" in cal.explain()


def test_probes_stop_at_the_longest_micro_batch_the_lengths_allow():
    device = Device(QUADRATIC)
    lengths = [100, 300, 200]  # 600 tokens in all, far below the budget's scale
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExtrapolationWarning)
        cal = calibrate(device.step, 64 << 30, lengths=lengths, meter=device.meter)
    assert max(sum(p) for p in device.ran) == 600 and cal.lengths_total == 600
    assert cal.extrapolation()["factor"] <= 1.0


def test_probes_cut_short_warn_and_explain_says_so():
    device = Device(QUADRATIC)
    with pytest.warns(ExtrapolationWarning, match=r"an extrapolation past 2x the probes"):
        cal = calibrate(device.step, 16 << 30, probes=6, meter=device.meter)
    assert cal.extrapolation()["factor"] > 2.0
    assert "an extrapolation past 2x the probes" in cal.explain()
    with pytest.warns(ExtrapolationWarning):
        cal.rebudget(64 << 30)


def test_a_device_smaller_than_the_budget_warns_as_its_probes_stop():
    device = Device(QUADRATIC, capacity=200 << 20)
    with pytest.warns(ExtrapolationWarning):
        cal = calibrate(device.step, 16 << 30, meter=device.meter)
    assert any(p.error.startswith("out of memory") for p in cal.probes)


# --- dead ends are ValueErrors naming their cause ---------------------------------------------------


def test_a_meter_that_sees_nothing_is_named():
    device = Device(QUADRATIC)
    with pytest.raises(ValueError, match=r"the meter read 0 bytes for a micro-batch of \d+ tokens.*sees nothing"):
        calibrate(device.step, 1 << 30, meter=lambda run: (run(), 0)[1])


def test_a_step_whose_peak_does_not_grow_is_named():
    device = Device(MemoryModel(fixed=5e8))
    with pytest.raises(ValueError, match="do not grow with the tokens"):
        calibrate(device.step, 1 << 30, meter=device.meter)
    device = Device(MemoryModel(fixed=5e8))  # the same through explicit probes: no growth term
    with pytest.raises(ValueError, match="the fit has no growth term"):
        calibrate(device.step, 1 << 30, probes=[[64], [128], [32, 32], [256], [512]], meter=device.meter)


def test_a_budget_below_every_probe_is_named():
    device = Device(QUADRATIC)  # 5 MB fixed: a 1 MB budget holds no micro-batch at all
    with pytest.raises(ValueError, match=r"the budget is below every probe: the smallest, 32 tokens, peaked at"):
        calibrate(device.step, 1 << 20, meter=device.meter)


def test_a_budget_below_the_fixed_bytes_gives_no_cap_of_zero():
    cal = Calibration(QUADRATIC, 4 << 20)  # below the 5 MB every micro-batch holds
    with pytest.raises(ValueError, match=r"not even one sequence of 1 tokens is predicted within \d+ bytes"):
        cal.max_token_len
    assert cal.to_dict()["max_token_len"] is None  # still saved, for another budget


@pytest.mark.parametrize("length_range", [None, (1, 100), (50, 50)])
def test_a_flat_model_has_no_cap_and_says_why(length_range):
    flat = MemoryModel(fixed=1e6, per_longest=10.0) if length_range else MemoryModel(fixed=1e6)
    with pytest.raises(ValueError, match="no growth with tokens|grows too slowly"):
        flat.max_token_len(2e6, length_range)
    nearly = MemoryModel(fixed=1e6, per_token=1e-9)
    with pytest.raises(ValueError, match="no growth with tokens|grows too slowly"):
        nearly.max_token_len(2e6, length_range)
