"""seqbal.timing: the time model's fit, calibrate's probes and timer contract, the Recorder
(alone and pooled over 2 gloo ranks under a hard deadline), and the workload they give planners.

Timings here come from known formulas through ``timer=`` (so the tests are exact and never
depend on the machine's speed); the real clocks are exercised for their contract (positive,
the fastest of the repeats), and the accuracy on a real model is a benchmark
(docs/benchmarks.md), not a test: no wall-clock threshold here.
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from seqbal import build_dp_schedule
from seqbal.calibration.nnls import weighted_nnls
from seqbal.timing import (Recorder, TimeCalibration, TimeModel, calibrate, fastest_schedule, features, fit,
                           predicted_step_seconds, time_step)
from tests.deadline import run_with_deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUE = TimeModel(fixed=2e-3, per_sequence=1e-4, per_token=3e-6, per_token_squared=4e-10)


class Fake:
    """A step and a timer: the step notes its lengths, the timer runs it and returns the true
    model's seconds for them (times ``1 + noise`` per call when given)."""

    def __init__(self, model: TimeModel = TRUE, noise: float = 0.0, seed: int = 0) -> None:
        self.model, self.noise, self.rng = model, noise, np.random.default_rng(seed)
        self.calls: list[list[int]] = []
        self.timed = 0

    def step(self, lengths):
        self.calls.append(list(lengths))

    def timer(self, run):
        run()
        self.timed += 1
        return self.model.predict(self.calls[-1]) * (1 + abs(self.noise * self.rng.standard_normal()))


def test_calibrate_recovers_the_model_and_counts_its_calls():
    fake = Fake()
    cal = calibrate(fake.step, max_token_len=4096, timer=fake.timer, repeats=2, warmup=2)
    assert 4 <= len(cal.probes) <= 24
    assert np.allclose(cal.model.coefficients, TRUE.coefficients, rtol=1e-6, atol=1e-12)
    assert max(sum(p.lengths) for p in cal.probes) == 4096 == cal.largest_tokens
    assert min(sum(p.lengths) for p in cal.probes) >= 64
    # warm-up calls are the largest probe, untimed, before any probe; then repeats x probes timed calls
    assert fake.calls[:2] == [list(max(cal.probes, key=lambda p: (sum(p.lengths), len(p.lengths))).lengths)] * 2
    assert len(fake.calls) == 2 + 2 * len(cal.probes) and fake.timed == 2 * len(cal.probes)
    text = cal.explain()
    assert "fastest of 2 call(s) each after 2 untimed warm-up call(s)" in text and "custom timer" in text


def test_probes_stay_within_the_users_lengths_and_the_count():
    fake = Fake()
    lengths = [40, 300, 900, 1500]
    cal = calibrate(fake.step, lengths=lengths, max_token_len=3000, probes=10, timer=fake.timer)
    assert len(cal.probes) == 10
    assert all(40 <= s <= 1500 for p in cal.probes for s in p.lengths[:-1])  # the last piece may be shorter
    assert all(sum(p.lengths) <= 3000 for p in cal.probes)
    assert "sampled" in {p.shape for p in cal.probes}


def test_best_of_repeats_is_kept():
    fake = Fake(noise=0.5, seed=3)
    cal = calibrate(fake.step, max_token_len=1024, probes=8, repeats=5, timer=fake.timer)
    for probe in cal.probes:  # the noise only adds time: the fastest of 5 is at least the true time
        assert probe.seconds >= TRUE.predict(probe.lengths) * (1 - 1e-12)


def test_given_probes_and_errors():
    fake = Fake()
    given_probes = [[100], [50, 50], [10] * 10, [400], [200, 100, 100]]
    cal = calibrate(fake.step, probes=given_probes, timer=fake.timer)
    assert [list(p.lengths) for p in cal.probes] == sorted(given_probes, key=sum)
    with pytest.raises(ValueError, match="at least 4"):
        calibrate(fake.step, probes=3, timer=fake.timer)
    with pytest.raises(ValueError, match="5000 tokens exceeds max_token_len 4096"):
        calibrate(fake.step, lengths=[10, 5000], max_token_len=4096, timer=fake.timer)
    with pytest.raises(ValueError, match="max_token_len must be a positive int"):
        calibrate(fake.step, max_token_len=0, timer=fake.timer)
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        calibrate(fake.step, repeats=0, timer=fake.timer)
    with pytest.raises(ValueError, match="times must be positive"):
        calibrate(fake.step, max_token_len=256, probes=4, timer=lambda run: run() or 0.0)


def test_save_load_round_trip_and_workload(tmp_path):
    fake = Fake()
    cal = calibrate(fake.step, max_token_len=2048, timer=fake.timer)
    cal.save(tmp_path / "time.json")
    back = TimeCalibration.load(tmp_path / "time.json")
    assert back == cal and back.workload_fn == cal.workload_fn
    data = json.loads((tmp_path / "time.json").read_text())
    assert data["format"] == "seqbal.timing.calibration/1" and data["workload_fn"] == cal.workload_fn.coefficients
    with pytest.raises(ValueError, match="not a seqbal time calibration"):
        TimeCalibration.from_dict({"format": "other"})
    with pytest.raises(ValueError, match="cannot read"):
        TimeCalibration.load(tmp_path / "missing.json")


@given(st.lists(st.integers(1, 50_000), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_workload_is_proportional_to_each_sequences_seconds(lengths):
    w = TRUE.workload_fn
    values = w(lengths)
    assert values.dtype == np.int64 and (values > 0).all()
    seconds = np.array([TRUE.sequence_seconds(s) for s in lengths])
    ratio = values / seconds
    assert ratio.max() / ratio.min() < 1 + 1e-4  # one scale for every length (coefficients rounded to ints)


def test_workload_plans_and_without_per_sequence_cost_is_an_error():
    cal = TimeCalibration(TRUE)
    schedule = build_dp_schedule([4000, 10, 10, 1000, 1000, 1000, 30, 2000], 2, 4096, workload_fn=cal.workload_fn)
    assert sorted(i for r in schedule.rank_indices for i in r) == list(range(8))
    with pytest.raises(ValueError, match="no per-sequence cost"):
        TimeModel(fixed=1.0).workload_fn


@given(st.lists(st.floats(0, 1e-2), min_size=4, max_size=4), st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_fit_recovers_noiseless_models(coefficients, seed):
    rng = np.random.default_rng(seed)
    batches = [rng.integers(1, 3000, int(rng.integers(1, 12))).tolist() for _ in range(16)]
    rows = np.array([features(b) for b in batches])
    seconds = rows @ np.array(coefficients) + 1e-6  # a positive time (a microsecond of fixed cost)
    fitted = fit(rows, seconds)
    assert (fitted >= 0).all()
    assert np.allclose(rows @ fitted, seconds, rtol=1e-6)


@given(st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_portable_nnls_agrees_with_numpys(seed):
    rng = np.random.default_rng(seed)
    rows = np.array([features(rng.integers(1, 3000, int(rng.integers(1, 12))).tolist()) for _ in range(12)])
    values = rows @ rng.uniform(0, 1e-3, 4) * rng.uniform(0.8, 1.2, 12) + 1e-4
    weights = 1 / values

    def error(c):
        return float(np.sum((weights * (rows @ c - values)) ** 2))

    portable, numpy_ = weighted_nnls(rows, values, weights, portable=True), weighted_nnls(rows, values, weights)
    assert (portable >= 0).all() and error(portable) <= error(numpy_) * (1 + 1e-6) + 1e-18


def test_time_step_on_the_cpu_is_the_fastest_positive_call():
    calls = []
    seconds = time_step(lambda: calls.append(sum(range(20_000))), "cpu", repeats=3)
    assert seconds > 0 and len(calls) == 3
    with pytest.raises(ValueError, match="repeats"):
        time_step(lambda: None, "cpu", repeats=0)


def test_calibrate_on_a_real_step():
    torch = pytest.importorskip("torch")
    from benchmarks.tiny_lm import TinyLM, make_step

    torch.manual_seed(0)
    step = make_step(TinyLM(vocab=128, hidden=32, heads=2, layers=1))
    cal = calibrate(step, max_token_len=256, probes=6, repeats=1, device="cpu")
    assert cal.clock == "thread cpu time" and cal.device == "cpu" and len(cal.probes) == 6
    assert all(p.seconds > 0 for p in cal.probes) and cal.predict([256]) > 0


def test_recorder_records_skips_and_bounds():
    recorder = Recorder(max_records=5, skip=2)
    for i in range(10):
        recorder.record([10 + i, 5], 0.001 * (i + 1))
    records = recorder.records()
    assert len(records) == 5 and records[0] == ((15, 5), 0.006)  # 2 skipped, 3 more dropped (oldest)
    for bad, match in (([], "one or more lengths"), ([0], "one or more lengths")):
        with pytest.raises(ValueError, match=match):
            recorder.record(bad, 0.1)
    for seconds in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive and finite"):
            recorder.record([10], seconds)
    with pytest.raises(ValueError, match="fewer than min_records 8"):
        recorder.fit()
    recorder.clear()
    assert len(recorder) == 0


def test_recorder_fit_recovers_the_model_and_times_blocks():
    recorder = Recorder()
    rng = np.random.default_rng(0)
    for _ in range(40):
        lengths = rng.integers(1, 4000, int(rng.integers(1, 9))).tolist()
        recorder.record(lengths, TRUE.predict(lengths))
    fitted = recorder.fit()
    assert fitted.source == "recorder" and len(fitted.probes) == 40
    assert np.allclose(fitted.model.coefficients, TRUE.coefficients, rtol=1e-6, atol=1e-12)
    with recorder.timed([7, 9], device="cpu"):
        sum(range(50_000))
    assert recorder.records()[-1][0] == (7, 9) and recorder.records()[-1][1] > 0


def test_recorder_pools_two_gloo_ranks_bit_for_bit(tmp_path):
    from tests.timing_workers import rank_records

    script = (
        "import multiprocessing as mp, sys\n"
        "from tests.timing_workers import main\n"
        "if __name__ == '__main__':\n"
        f"    ps = [mp.get_context('spawn').Process(target=main, args=(r, 2, {str(tmp_path / 'init')!r}, "
        f"{str(tmp_path)!r})) for r in range(2)]\n"
        "    [p.start() for p in ps]; [p.join() for p in ps]\n"
        "    sys.exit(max(p.exitcode for p in ps))\n"
    )
    result = run_with_deadline([sys.executable, "-c", script], deadline_s=180.0, cwd=ROOT, what="2 recorder ranks")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all("crash" not in r for r in ranks), ranks
    assert rank_records(0) != rank_records(1)  # different local records ...
    assert ranks[0]["coefficients"] == ranks[1]["coefficients"]  # ... the same bits on every rank
    assert ranks[0]["workload"] == ranks[1]["workload"]
    assert all(r["collectives"] == 1 and r["records"] == 24 and r["device"] == "ranks:2" for r in ranks)
    alone = Recorder()
    for rank in range(2):
        for lengths, seconds in rank_records(rank):
            alone.record(lengths, seconds)
    assert [float(v).hex() for v in alone.fit().model.coefficients] == ranks[0]["coefficients"]
    assert ranks[0]["small"] == ranks[1]["small"] and "1 record(s) on ranks:2" in ranks[0]["small"]


def test_memory_calibrate_fits_time_from_the_same_probes(tmp_path):
    from seqbal.memory import Calibration, calibrate as memory_calibrate

    fake = Fake()

    def meter(run):
        run()
        s = np.asarray(fake.calls[-1])
        return int(10_000 + 64 * s.sum() + 2 * (s * s).sum())

    cal = memory_calibrate(fake.step, 50_000_000, meter=meter, time=True, timer=fake.timer)
    metered = [p.lengths for p in cal.probes if p.peak_bytes]
    assert [p.lengths for p in cal.timing.probes] == metered and len(metered) >= 4
    assert np.allclose(cal.timing.model.coefficients, TRUE.coefficients, rtol=1e-6, atol=1e-12)
    assert cal.timing.repeats == 3 and cal.timing.clock == "custom timer"
    cal.save(tmp_path / "both.json")
    assert Calibration.load(tmp_path / "both.json").timing == cal.timing
    assert cal.rebudget(40_000_000).timing == cal.timing
    assert memory_calibrate(fake.step, 50_000_000, meter=meter).timing is None


def test_recorder_live_workload_follows_the_latest_fit():
    from seqbal import calculate_workload

    recorder = Recorder()
    live = recorder.workload_fn
    assert live([10, 1000]).tolist() == calculate_workload([10, 1000]).tolist()  # before any fit: the default
    rng = np.random.default_rng(1)
    for _ in range(20):
        lengths = rng.integers(1, 4000, int(rng.integers(1, 9))).tolist()
        recorder.record(lengths, TRUE.predict(lengths))
    fitted = recorder.fit()
    assert recorder.workload_fn is live and live([10, 1000]).tolist() == fitted.workload_fn([10, 1000]).tolist()
    schedule = build_dp_schedule([4000, 10, 10, 1000, 1000, 1000], 2, 4096, workload_fn=live)
    assert sorted(i for r in schedule.rank_indices for i in r) == list(range(6))


def test_timing_benchmark_quick_runs(tmp_path):
    pytest.importorskip("torch")
    from benchmarks import timing as bench

    out = tmp_path / "timing.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["kind"] == "sdpa" and 4 <= result["probes"] <= 24 and result["held_out"] == 4
    assert result["step_calls"] == 1 + 3 * result["probes"]  # one warm-up call, three timed calls per probe
    assert all(np.isfinite(row["error"]) and row["seconds"] > 0 for row in result["rows"])


def test_a_fit_without_per_sequence_cost_leaves_the_live_workload():
    from seqbal import calculate_workload

    recorder = Recorder()
    for lengths in ([10], [20, 30], [400], [5] * 9, [100, 100], [7], [3000], [50] * 4):
        recorder.record(lengths, 0.01)  # the same time whatever the lengths: only a fixed cost
    fitted = recorder.fit()
    assert fitted.model.sequence_seconds(1000) == 0 and recorder.fitted is None
    assert recorder.workload_fn([10, 1000]).tolist() == calculate_workload([10, 1000]).tolist()


# -- the count chosen by the clock ----------------------------------------------------------------


def _brute_step_seconds(schedule, lengths, model, sync):
    times = [[model.predict([lengths[i] for i in mb]) if mb else 0.0 for mb in rank] for rank in schedule.micro_batches]
    if sync == "step":
        return max(sum(rank) for rank in times)
    return sum(max(rank[i] for rank in times) for i in range(len(times[0])))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 2048), min_size=4, max_size=60), ranks=st.integers(1, 4),
       fixed=st.sampled_from([0.0, 1e-4, 1e-2]), squared=st.sampled_from([0.0, 1e-8, 1e-7]),
       sync=st.sampled_from(["step", "micro_batch"]), extra=st.integers(0, 3), gain=st.sampled_from([0.0, 0.03, 0.2]))
def test_fastest_schedule_is_the_fastest_count_it_tries_and_keeps_every_promise(lengths, ranks, fixed, squared, sync,
                                                                                 extra, gain):
    """The fewest count, or the larger count (up to ``extra`` more per rank) of least predicted
    step time among those at least ``gain`` faster (the fewest on a tie); every sample once
    under the cap; the prediction is the model's sum per rank (or per slot)."""
    cap = 2048
    cal = TimeCalibration(TimeModel(fixed=fixed, per_sequence=1e-5, per_token=1e-6, per_token_squared=squared))
    try:
        fewest = build_dp_schedule(lengths, ranks, cap, workload_fn=cal.workload_fn)
    except ValueError as error:  # no schedule at all (more micro-batches needed than groups): the same error
        with pytest.raises(ValueError, match=re.escape(str(error))):
            fastest_schedule(lengths, ranks, cap, cal, sync=sync, extra_micro_batches=extra, min_gain=gain)
        return
    chosen = fastest_schedule(lengths, ranks, cap, cal, sync=sync, extra_micro_batches=extra, min_gain=gain)
    assert sorted(i for rank in chosen.micro_batches for mb in rank for i in mb) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in mb) <= cap for rank in chosen.micro_batches for mb in rank)
    assert fewest.num_micro_batches <= chosen.num_micro_batches <= fewest.num_micro_batches + extra
    seconds = predicted_step_seconds(chosen, lengths, cal, sync)
    base = predicted_step_seconds(fewest, lengths, cal, sync)
    assert seconds == pytest.approx(_brute_step_seconds(chosen, lengths, cal, sync))
    if chosen.num_micro_batches > fewest.num_micro_batches:
        assert seconds <= base * (1 - gain)
    for more in range(1, extra + 1):
        try:
            other = build_dp_schedule(lengths, ranks, cap, workload_fn=cal.workload_fn,
                                      min_num_micro_batch=fewest.num_micro_batches + more)
        except ValueError:
            break
        other_seconds = predicted_step_seconds(other, lengths, cal, sync)
        if other_seconds <= base * (1 - gain):  # a count it could take: none faster than the one it took
            assert other_seconds >= seconds - (0 if other.num_micro_batches > chosen.num_micro_batches else 1e-12)


def test_fastest_schedule_takes_a_micro_batch_more_where_full_ones_cannot_balance():
    """Cap 4096, 2 ranks, one 1,500-token sequence and sixteen of 400: one micro-batch per rank
    holds it all, but the rank with the long sequence's squared cost runs longest; a second
    micro-batch per rank costs 1 ms more and evens the ranks (37 -> 34 ms predicted). With a
    fixed cost of 10 ms per micro-batch the fewest stays the fastest."""
    lengths = [1500] + [400] * 16
    cheap = TimeCalibration(TimeModel(fixed=1e-3, per_token=1e-6, per_token_squared=1e-8))
    assert fastest_schedule(lengths, 2, 4096, cheap).num_micro_batches == 2
    assert fastest_schedule(lengths, 2, 4096, cheap, extra_micro_batches=0).num_micro_batches == 1
    costly = TimeCalibration(TimeModel(fixed=1e-2, per_token=1e-6, per_token_squared=1e-8))
    assert fastest_schedule(lengths, 2, 4096, costly).num_micro_batches == 1
    assert fastest_schedule(lengths, 2, 4096, cheap, min_gain=0.1).num_micro_batches == 1  # 8% faster: under 10%


def test_fastest_schedule_refuses_what_it_cannot_honour():
    cal = TimeCalibration(TimeModel(fixed=1e-3, per_token=1e-6))
    with pytest.raises(ValueError, match="pass the time model, not a workload_fn"):
        fastest_schedule([10, 20], 1, 64, cal, workload_fn=len)
    with pytest.raises(ValueError, match="sync must be one of"):
        fastest_schedule([10, 20], 1, 64, cal, sync="rank")
    with pytest.raises(ValueError, match="extra_micro_batches must be an int >= 0"):
        fastest_schedule([10, 20], 1, 64, cal, extra_micro_batches=-1)
    with pytest.raises(ValueError, match=r"min_gain must be a share in \[0, 1\)"):
        fastest_schedule([10, 20], 1, 64, cal, min_gain=1.5)
    with pytest.raises(ValueError, match="exceeds"):
        fastest_schedule([100, 20], 1, 64, cal)
