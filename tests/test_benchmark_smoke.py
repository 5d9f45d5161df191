"""A seconds-long run of the benchmark, so the harness cannot rot between full runs.

Asserts the table's shape and the one count target that must hold on every case (seqbal never
needs more micro-batches than the reference loop); no wall-clock thresholds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import run, workloads  # noqa: E402

SMOKE = run.Grid(
    families=("lognormal", "grpo_groups", "adv_7_of_8", "real_gsm8k"),
    sizes=(64,),
    caps=(4096, 16384),
    repeats=1,
    reference_budget=5.0,
)


@pytest.fixture(scope="module")
def smoke():
    return run.run_grid(SMOKE, log=lambda *_, **__: None)


def test_every_expected_row_is_there(smoke):
    rows, notes = smoke
    expected = [f for f in SMOKE.families if f in workloads.families()]
    assert [(r.family, r.n, r.cap) for r in rows] == [(f, n, c) for f in expected for n in SMOKE.sizes for c in SMOKE.caps]
    if "real_gsm8k" not in expected:
        assert any("real_gsm8k" in note for note in notes)
    table = run.format_table(rows)
    assert len(table.splitlines()) == 2 + len(rows)
    assert all(r.family in table for r in rows)


def test_seqbal_never_needs_more_micro_batches_than_the_reference(smoke):
    rows, _ = smoke
    compared = [r for r in rows if r.ref_count is not None]
    assert compared, "the reference ran on no case"
    for r in compared:
        assert r.lower_bound <= r.count <= r.ref_count, (r.family, r.n, r.cap, r.count, r.ref_count)
        assert 0 < r.fill <= 1 and r.imbalance >= 1


def test_targets_and_markdown_render(smoke, tmp_path):
    rows, notes = smoke
    lines = run.targets(rows)
    assert lines[0].startswith("- Count <= reference on every case: **met**")
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nhand-written text\n")
    run.write_markdown(out, run.results_markdown(rows, notes, lines, "python -m benchmarks.run --grid smoke", 1.0))
    run.write_markdown(out, run.results_markdown(rows, notes, lines, "python -m benchmarks.run --grid smoke", 1.0))
    text = out.read_text()
    assert text.count(run.RESULTS_BEGIN) == 1 and "hand-written text" in text


def test_planning_cost_harness_runs_and_compares(tmp_path, capsys):
    from benchmarks import planning_cost

    record = tmp_path / "record.json"
    assert planning_cost.main(["--families", "lognormal", "--sizes", "64", "--caps", "4096", "--repeats", "1",
                               "--out", str(record)]) == 0
    assert planning_cost.main(["--families", "lognormal", "--sizes", "64", "--caps", "4096", "--repeats", "1",
                               "--compare", str(record)]) == 0
    out = capsys.readouterr().out
    assert "before: count" in out and "COUNT UP" not in out  # deterministic: the same count twice
    assert planning_cost.main(["--table", str(record), str(record)]) == 0
    assert "| lognormal | 64 | 4096 |" in capsys.readouterr().out


def test_planning_ab_harness_compares_a_tree_with_itself(capsys):
    from pathlib import Path

    import seqbal
    from benchmarks import planning_ab

    tree = Path(seqbal.__file__).resolve().parent.parent  # the imported package's folder: CI runs the wheel
    assert planning_ab.main(["--ref", str(tree), "--cases", "uniform:64:4096", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "same plan" in out and "plans differ in 0" in out


def test_scale_and_driver_harnesses_run():
    from benchmarks import driver_and_gather, scale

    row = scale.one("near_third", 3000, 4096, 10**6)
    assert row["bound"] <= row["count"] and row["peak_mb"] >= 0
    lines = driver_and_gather.schedule_ratios(1, caps=(16384,), n=512, dp=4)
    families = [f for f in driver_and_gather.SCHEDULE_FAMILIES if f in workloads.families()]
    assert len(lines) == 2 + len(families) and all(line.startswith("|") for line in lines)


def test_schedule_planning_cost_mode_runs(tmp_path):
    import json

    from benchmarks import bench_schedule

    names = ["Pareto tail", "GRPO (groups kept)", "grpo_groups" + bench_schedule.WORKLOADS]
    lines = bench_schedule.planning_cost(names, [8192], n=512, dp=4, rounds=1, json_path=str(tmp_path / "cost.json"))
    assert len(lines) == 2 + len(names) and all(line.startswith("|") for line in lines)
    records = json.loads((tmp_path / "cost.json").read_text())
    assert [r["workload"] for r in records] == names
    assert all(r["count"] >= 1 and 0 < r["per_micro_batch"] <= 1 and r["ratio_median"] > 0 for r in records)


def test_schedule_planning_cost_side_by_side_compares_schedules(tmp_path):
    """``--ref``: the other tree's build_dp_schedule is timed in the same rounds and its schedule
    compared; the tree against itself reads the same, a reference that orders slots otherwise
    reads ``differs``."""
    import json
    from pathlib import Path

    from benchmarks import bench_schedule
    from benchmarks.planning_ab import load_reference_module
    import seqbal
    from seqbal import build_dp_schedule

    tree = Path(seqbal.__file__).resolve().parent.parent  # the imported package's folder: CI runs the wheel
    names = ["Pareto tail", "grpo_groups" + bench_schedule.WORKLOADS]
    itself = load_reference_module(tree, "schedule").build_dp_schedule
    lines = bench_schedule.planning_cost(names, [8192], n=512, dp=4, rounds=2, json_path=str(tmp_path / "a.json"),
                                         reference=itself)
    assert all(line.endswith("| yes |") for line in lines[2:])
    records = json.loads((tmp_path / "a.json").read_text())
    assert all(r["same_schedule"] and r["this_over_ref"] > 0 and r["ref_ratio_median"] > 0 for r in records)

    def other(lengths, dp, cap, group_ids=None):
        return build_dp_schedule(lengths, dp, cap, group_ids=group_ids, use_dynamic_bsz_balance=False)

    lines = bench_schedule.planning_cost(names[:1], [8192], n=512, dp=4, rounds=1, reference=other)
    assert lines[2].endswith("| differs |")


def test_exact_counts_harness_runs(capsys):
    from benchmarks import exact_counts

    assert exact_counts.main(["--cases", "300"]) == 0
    assert "above the exact optimum on" in capsys.readouterr().out


def test_trl_benchmark_smoke():
    """benchmarks.trl on small slices: every route whose package is here runs, seqbal meets the
    done-when targets (no forward over the cap, equal steps, imbalance no worse than TRL's)."""
    from benchmarks import trl as trl_bench

    rows, notes = trl_bench.run(limit=200, cap=4096, worlds=(4,), log=lambda *_: None)
    assert rows and all(r.route != "seqbal" or (r.over_cap == 0 and "/" not in r.steps) for r in rows)
    assert {r.route for r in rows} | {n.split(":")[0] for n in notes} == {"trl-padding-free", "trl-bfd", "hf-rebalance", "seqbal"}
    assert trl_bench.done_when(rows) == []
    assert len(trl_bench.format_table(rows).splitlines()) == 2 + len(rows)


def test_trl_train_benchmark_smoke():
    """benchmarks.trl_train on a tiny configuration: real SFTTrainer.train() on 2 gloo ranks for
    every route, each launch under a hard deadline (its process group killed past it). Every
    route trains the same samples, once each; seqbal never forwards more than the budget; every
    measurement is there, and TRL's route reads 1.00 against itself."""
    pytest.importorskip("trl")
    if not hasattr(pytest.importorskip("transformers.trainer_pt_utils"), "BatchRebalanceSampler"):
        pytest.skip("transformers without BatchRebalanceSampler (before 5.24.0)")
    from benchmarks import trl_train

    _, config = trl_train.parse(["--smoke", "--timeout", "240"])
    lengths, _ = trl_train.load_lengths(config)
    rows, notes = trl_train.run(config, log=lambda *_: None)
    by_route = {row["route"]: row for row in rows}
    assert sorted(by_route) == sorted(trl_train.ROUTES)
    for row in rows:
        assert len(row["wall_s"]) == config.rounds * config.epochs and min(row["wall_s"]) > 0
        assert row["samples"] == [config.samples] and row["tokens"] == [int(lengths.sum())], row["route"]
        assert min(row["forwards"]) >= 1 and row["max_tokens"] >= int(lengths.max())
        assert min(row["peak_rss_mb"]) > 0 and min(row["blocked_s"]) >= min(row["allreduce_wait_s"]) >= 0
    assert by_route["seqbal"]["max_tokens"] <= config.budget and by_route["seqbal"]["over_budget"] == [0]
    assert by_route["trl"]["wall_ratio"] == [1.0] and by_route["trl"]["peak_ratio"] == [1.0]
    assert len(trl_train.format_table(rows).splitlines()) == 2 + len(rows)
    assert not any("differ" in note for note in notes), notes


def test_sample_cap_benchmark_smoke(capsys):
    """benchmarks.sample_cap on one small case per family: it runs, checks both caps itself,
    and its table has a row per case with the count never below its bound."""
    from benchmarks import sample_cap

    assert sample_cap.main(["--families", "lognormal", "grpo_groups", "--sizes", "64", "--caps", "4096",
                            "--caps-samples", "8", "--repeats", "1"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert len(table) == 2 + 2
    row = sample_cap.run_case("lognormal", 256, 4096, 4, 1)
    assert row["count"] >= row["bound"] >= -(-256 // 4)


def test_prove_count_decides_small_packings():
    """The proof script behind docs/benchmarks_method.md's named proof case: exact on inputs
    whose answer is known by hand (skipped where OR-Tools is not installed: it is no dependency)."""
    pytest.importorskip("ortools")
    from benchmarks.prove_count import case_items, fits_in

    # 7 and 6 are above half the cap, so they sit apart; 5 fits in neither hole (3 and 4).
    assert fits_in([7, 6, 5, 2], 10, 2)[0] == "INFEASIBLE"
    # three large items for two micro-batches: decided before any search
    assert fits_in([6, 6, 6], 10, 2) == ("INFEASIBLE", None)
    # seqbal/partition/exact.py's example: 4 parts of 118 exist (no heuristic try finds them)
    items = [39, 42, 39, 42, 36, 39, 44, 40, 41, 44, 35]
    status, where = fits_in(items, 118, 4)
    assert status == "FEASIBLE"
    assert sorted(set(where)) == [0, 1, 2, 3]
    assert all(sum(s for s, b in zip(items, where) if b == part) <= 118 for part in range(4))
    # forced groups are summed into one packing item each
    assert len(case_items("grpo_groups", 64, 4096)) < 64


def test_schedule_tradeoff_compares_variants_and_restores_the_evening(capsys):
    """The table behind docs/benchmarks_method.md's point 3 frontier: every variant is measured
    against today's evening on the same batches, no variant changes a count, and the evening's
    function and constants are the shipped ones again afterwards."""
    from benchmarks import schedule_tradeoff
    from seqbal.schedule import slots

    shipped = (slots._even_slots, slots.SLOT_CLOSE_ENOUGH, slots.SLOT_BUDGET_PER_SLOT)
    rows = schedule_tradeoff.measure(["Pareto tail"], ["close-1e-3", "budget-16"], 2048, 8, 1, caps=(8192,))
    assert (slots._even_slots, slots.SLOT_CLOSE_ENOUGH, slots.SLOT_BUDGET_PER_SLOT) == shipped
    assert {variant for variant, _, _ in rows} == {"today", "close-1e-3", "budget-16"}
    today = rows[("today", "Pareto tail", 8192)]
    assert 0 < today["per_micro_batch"] <= 1 and 0 < today["per_step"] <= 1 and today["ratio"] > 0
    # a looser stop changes the schedule, not its count
    assert all(row["count"] == today["count"] for row in rows.values())
    summary = schedule_tradeoff.summary(rows)
    assert len(summary) == 2 + 3 and summary[2].startswith("| today |") and "| 0 / 0 |" in summary[2]
    schedule_tradeoff.main(["--names", "Pareto tail", "--variants", "close-1e-4", "--n", "1024", "--dp", "4",
                            "--rounds", "1"])
    out = capsys.readouterr().out
    assert "| close-1e-4 |" in out and out.count("| Pareto tail |") == 2  # caps 16384 and 32768


def test_sft_epochs_benchmark_smoke():
    """benchmarks.sft_epochs on small slices: every route plans every epoch, seqbal repeats none
    of epoch 0's mixes where its draws fit, and the scale row reports the sampler's figures."""
    from benchmarks import sft_epochs

    lengths = np.random.default_rng(0).integers(20, 900, 600)
    for route, fn in sft_epochs.ROUTES.items():
        plans = fn(lengths, 4096, 2, 1, 3)
        assert len(plans) == 3
        for plan in plans:
            assert sorted(i for rank in plan for mb in rank for i in mb) == list(range(600)), route
            assert all(lengths[mb].sum() <= 4096 for rank in plan for mb in rank), route
    seqbal_plans = sft_epochs.seqbal_route(lengths, 4096, 2, 1, 3)
    assert sft_epochs.repeat_share(lengths, seqbal_plans) == 0.0
    assert sft_epochs.repeat_share(lengths, sft_epochs.plan_once_route(lengths, 4096, 2, 1, 3)) == 1.0
    table = sft_epochs.mix_table([4096], 2, 2, 2, limit=200)
    assert table.count("| seqbal |") >= 1 and table.count("| plan once |") == table.count("| seqbal |")
    assert table.count("| uniform 1-2048 x") == 2 * len(sft_epochs.ROUTES)  # groups of 2 under cap 4096
    scale = sft_epochs.scale_table(5_000, [2], [8192], 1, "lognormal").splitlines()
    assert len(scale) == 3 and "| fresh |" in scale[2]


def test_step_fill_benchmark_smoke():
    """benchmarks.step_fill for a few steps: every scenario takes steps, ratios are measured on
    the steps over capacity, and max_wait_steps is kept."""
    from benchmarks import step_fill

    lengths = np.arange(1, 1025, dtype=np.int64)
    for scenario, (arrivals, wait) in step_fill.SCENARIOS.items():
        result = step_fill.simulate(lengths, arrivals, wait, 15, 0)
        assert result["waits"] and result["ratios"], scenario
        assert wait is None or max(result["waits"]) <= wait, scenario
    assert _uniform_rows(step_fill.table(5, 1)) > 0


def _uniform_rows(lines):
    return sum("| uniform 1-1024 |" in line for line in lines)


def test_axolotl_benchmark_smoke(monkeypatch):
    """benchmarks.axolotl on a slice of the shipped lengths, 2 ranks: axolotl's own sampler (its
    own code) and seqbal's both run; seqbal trains every sample, under the cap, with equal counts."""
    import importlib.util

    if importlib.util.find_spec("axolotl") is None:
        pytest.skip("needs axolotl (its own CI environment)")
    from benchmarks import axolotl as bench

    import numpy as np
    from importlib.resources import files

    monkeypatch.setattr(bench, "REPEATS", 1)
    lengths = np.loadtxt(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt", dtype=np.int64)[:300]
    theirs = bench.measure("shipped", lengths, 2, "axolotl", bench.axolotl_plan)
    ours = bench.measure("shipped", lengths, 2, "seqbal", bench.seqbal_plan)
    assert ours["max_tokens"] <= bench.CAP and "/" not in ours["per_rank"] and ours["samples"] == ours["of"] == 300
    assert int(ours["per_rank"]) % bench.GA == 0 and ours["imbalance_max"] >= 1
    assert theirs["max_tokens"] <= bench.CAP and 0 <= theirs["loss_micro"][0] <= 1 and theirs["loss_micro"][1] >= 1


# ---------------------------------------------------------------------------------------------
# The clock benchmark (benchmarks/clock.py): a tiny model, one small case; structure, no timings
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clock_run():
    import argparse

    from benchmarks import clock

    args = argparse.Namespace(device="cpu", lists=[clock.LISTS[0]], caps=[512], ranks=[2], micro_batches=2,
                              repeats=2, recorder_steps=2, control=True, json=None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(clock.SIZES, "h8", dict(hidden=8, heads=2, layers=1, intermediate=16))
        return clock.run_model("h8", "sdpa", args)


def test_clock_runs_every_row_or_says_why_not(clock_run):
    from benchmarks import clock

    rows, notes = clock_run
    ran = [r["row"] for r in rows if r["row"] != clock.CONTROL]
    assert len(rows) == len(ran) + 1  # and the control
    left_out = [row for row in clock.ROWS if any(note.startswith(f"{row}: left out") for note in notes)]
    assert sorted(ran + left_out) == sorted(clock.ROWS) and len(set(ran)) == len(ran)
    assert {"seqbal default", "seqbal tokens", "prime-rl packer"} <= set(ran)


def test_clock_efficiencies_are_efficiencies(clock_run):
    from benchmarks import clock

    rows, _ = clock_run
    for r in rows:
        for sync in ("", "proxy_"):
            assert 0 < r[f"{sync}per_mb"] <= r[f"{sync}per_step"] + 1e-12 <= 1 + 1e-9, r
        assert r["noise_per_mb"] >= 0 and r["noise_per_step"] >= 0 and r["step_seconds"] > 0
        if r["row"] == clock.CONTROL:  # every rank runs the same micro-batches: balanced by construction
            assert r["proxy_per_mb"] == pytest.approx(1.0) and r["proxy_per_step"] == pytest.approx(1.0)
        if r["row"] != "transformers BatchRebalanceSampler":  # the one planner without a token cap
            assert r["largest_over_cap"] <= 1, r
        if r["row"].startswith("seqbal") or r["row"] == "verl 0.9.1":
            assert len(r["counts"]) == 1, r  # every rank runs the same count


def test_clock_tables_render(clock_run):
    from benchmarks import clock

    rows, _ = clock_run
    summary = clock.summary_table(rows)
    assert len(summary) == 2 + len(rows) and all(r["row"] in "".join(summary) for r in rows)
    assert len(clock.by_model_table(rows)) == 2 + len(rows) == len(clock.by_list_table(rows))
    goals = clock.goal_lines(rows)
    assert [line.split(":")[0] for line in goals] == [f"- {row}" for row in clock.CALIBRATED]


def test_clock_efficiency_by_hand():
    from benchmarks.clock import efficiency

    # two ranks, two syncs: slot maxima 3 + 4 = 7, total 12 -> 12 / (2 * 7); rank totals 5 and 7
    assert efficiency([[3, 2], [3, 4]]) == pytest.approx((12 / 14, 6 / 7))
    assert efficiency([[2], [1, 1]]) == pytest.approx((4 / 6, 1.0))  # the short rank's missing sync costs 0


def test_prime_rl_packer_reimplementation():
    from benchmarks import prime_rl_packer

    config = dict(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=3,
                  intermediate_size=16, vocab_size=32)
    # per layer: q 2*8*2*4 = 128, k and v 4*8*1*4 = 128, o 2*8*8 = 128, MLP 6*8*16 = 768; head 2*8*32
    assert prime_rl_packer.cost_coefficients(config) == (3 * (128 + 128 + 128 + 768) + 512, 3 * 2 * 2 * 4)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=57).tolist()
    for ranks in (1, 3, 4):
        parts = prime_rl_packer.plan(lengths, 512, ranks, config)
        assert len(parts) == ranks and len({len(rank) for rank in parts}) == 1
        assert sorted(i for rank in parts for mb in rank for i in mb) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in mb) <= 512 for rank in parts for mb in rank)
    with pytest.raises(ValueError, match="longer than seq_len"):
        prime_rl_packer.plan([600], 512, 1, None)


def test_the_cpu_clock_keeps_freed_memory_mapped_where_glibc_runs():
    """benchmarks.tiny_lm.keep_freed_memory, in fresh processes (it changes malloc for good): on
    glibc it applies, and a 64 MiB buffer allocated again and again stops costing page faults
    (at least one of 6 calls after the first has none), where by default every call faults all
    of it in again."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's mallopt only")
    script = (
        "import resource, sys\n"
        "from benchmarks.tiny_lm import keep_freed_memory\n"
        "applied = keep_freed_memory() if sys.argv[1] == 'keep' else None\n"
        "import torch\n"
        "def faults():\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    torch.ones(64 << 20, dtype=torch.uint8).sum()\n"  # over glibc's largest mmap threshold (32 MiB)
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "faults()\n"
        "print(applied, min(faults() for _ in range(6)))\n"
    )

    def run(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120,
                             cwd=str(Path(__file__).resolve().parent.parent))
        applied, fewest = out.stdout.split()
        return applied, int(fewest)

    assert run("keep") == ("True", 0)
    assert run("default")[1] > 0  # every call faults the buffer in again (16,384 pages of 4 KiB here)
