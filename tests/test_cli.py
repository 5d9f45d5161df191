"""`seqbal plan` driven as a user drives it: a subprocess, its output and its exit code."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .invariants import assert_plan_invariants

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "seqbal" / "data" / "qwen25math_cot_rollouts.txt"


def run(*args: str, python_prefix: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SEQBAL_DEBUG", None)
    if python_prefix is None:
        command = [sys.executable, "-m", "seqbal", *args]
    else:
        command = [sys.executable, "-c", python_prefix + "\nfrom seqbal.cli import main\nraise SystemExit(main(sys.argv[1:]))", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def call(*args: str) -> Result:
    """In-process ``main(argv)``: same code path as the subprocess, without starting Python again.
    Used for the many input variants; the subprocess tests cover the real launch."""
    from seqbal.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse
            code = exit_.code
    return Result(code, stdout.getvalue(), stderr.getvalue())


def assert_clean_failure(result: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2, no traceback, exactly one line on stderr, containing every needle."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def plan_json(*args: str) -> dict:
    result = call("plan", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def rank_parts(lengths: np.ndarray, tokens_per_micro_batch: list[int]) -> None:
    """Cheap cross-check: the reported micro-batch tokens add up to the rank's tokens."""
    assert sum(tokens_per_micro_batch) == int(lengths.sum())


def test_default_sample_prints_seqbal_and_both_verl_versions():
    result = run("plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "qwen25math_cot_rollouts.txt (shipped sample): 800 samples, 383611 tokens" in out
    assert "seqbal: 94 micro-batches per rank" in out
    assert re.search(r"^verl >= 0\.9 \(strict loop\): 96 micro-batches per rank, 3 KK pass\(es\) \(\d+ ms\)", out, re.M)
    # verl <= 0.8: one KK pass at ceildiv(383611, 4096) = 94 parts, 64 of them over the cap
    assert "verl <= 0.8 (one KK pass): 94 micro-batches per rank, 64 over the cap, largest 4136" in out
    for title in ("samples", "tokens", "lower bound", "micro-batches", "fill %", "workload max/mean", "largest micro-batch"):
        assert title in out, title


def test_json_matches_library_and_agreement_rule():
    from seqbal import plan_micro_batches

    report = plan_json("--dp", "4", "--max-token-len", "8192", "--divisible-by", "2", "--route", "contiguous")
    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    chunks = np.array_split(lengths, 4)
    own_counts = [len(plan_micro_batches(c, 8192, num_batches_divided_by=2)) for c in chunks]
    rows = report["seqbal"]["ranks"]
    assert [r["samples"] for r in rows] == [200] * 4
    # the agreement rule: every rank runs the largest of the ranks' smallest counts
    assert {r["micro_batches"] for r in rows} == {max(own_counts)}
    assert report["seqbal"]["micro_batches_per_rank"] == max(own_counts)
    assert report["seqbal"]["all_reduces"] == 2
    for row, chunk in zip(rows, chunks):
        assert row["tokens"] == int(chunk.sum())
        assert row["lower_bound"] == -(-int(chunk.sum()) // 8192)
        assert row["largest_micro_batch"] <= 8192
        rank_parts(chunk, row["micro_batch_tokens"])
    old = report["verl_0_9"]
    assert old["kk_passes"] >= 1 and old["micro_batches_per_rank"] % 2 == 0
    assert all(r["largest_micro_batch"] <= 8192 for r in old["ranks"])
    assert report["verl_0_8"]["micro_batches_per_rank"] % 2 == 0


def test_subprocess_json_and_malformed_input(tmp_path):
    result = run("plan", "--json", "--dp", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["seqbal"]["all_reduces"] == 2
    path = tmp_path / "bad.txt"
    path.write_text("5\n7\nseven\n")
    assert_clean_failure(run("plan", str(path)), f"{path}:3", "seven")


def test_options_reach_the_planner(tmp_path):
    from seqbal.cli import simulate_ranks, split_over_ranks

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    split = split_over_ranks(lengths, 2, group_size=8, seed=3)
    plans = simulate_ranks(split.lengths, 16384, force_group_size=8, num_batches_divided_by=3, min_num_micro_batch=7)
    for rank_lengths, parts in zip(split.lengths, plans):
        assert_plan_invariants(rank_lengths, parts, 16384, force_group_size=8, num_batches_divided_by=3, min_num_micro_batch=7)
    assert len({len(p) for p in plans}) == 1
    report = plan_json("--dp", "2", "--group-size", "8", "--seed", "3", "--divisible-by", "3",
                       "--min-micro-batches", "7", "--max-token-len", "16384", "--route", "contiguous")
    assert [r["micro_batches"] for r in report["seqbal"]["ranks"]] == [len(p) for p in plans]
    assert [r["tokens"] for r in report["seqbal"]["ranks"]] == [int(c.sum()) for c in split.lengths]


def test_seed_shuffles_whole_groups():
    from seqbal.cli import split_over_ranks

    lengths = np.arange(24)
    split = split_over_ranks(lengths, 3, group_size=4, seed=0)
    merged = np.concatenate(split.lengths)
    assert sorted(merged.tolist()) == list(range(24))
    assert not np.array_equal(merged, lengths)
    assert all(int(g[0]) % 4 == 0 and np.array_equal(g, np.arange(g[0], g[0] + 4)) for g in merged.reshape(-1, 4))


@pytest.mark.parametrize(
    "name, content, extra",
    [
        ("lengths.txt", "5\n\n# comment\n7\n3\n", []),
        ("lengths.jsonl", '{"n": 5}\n{"n": [1, 2, 3, 4, 5, 6, 7]}\n{"n": 3}\n', ["--field", "n"]),
        ("bare.jsonl", "5\n7\n3\n", []),
    ],
)
def test_text_formats(tmp_path, name, content, extra):
    path = tmp_path / name
    path.write_text(content)
    report = plan_json(str(path), "--max-token-len", "8", *extra)
    assert report["input"]["samples"] == 3 and report["input"]["tokens"] == 15
    assert report["seqbal"]["micro_batches_per_rank"] == 2


def test_npy(tmp_path):
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([7] * 8, dtype=np.int32))
    report = plan_json(str(path), "--max-token-len", "8")
    # 8 x 7 tokens under a cap of 8: ceildiv says 7, but no two samples fit together
    row = report["seqbal"]["ranks"][0]
    assert row["lower_bound"] == 7 and row["micro_batches"] == 8


def test_parquet_without_pyarrow_is_explained(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "lengths.parquet"
    path.write_bytes(b"PAR1")
    result = call("plan", str(path), "--column", "n")
    assert_clean_failure(result, str(path), "pyarrow", "seqbal[parquet]")


def test_parquet_with_pyarrow(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "lengths.parquet"
    pq.write_table(pa.table({"n": [5, 7, 3], "other": [0, 0, 0]}), path)
    report = plan_json(str(path), "--column", "n", "--max-token-len", "8")
    assert report["input"]["tokens"] == 15


@pytest.mark.parametrize(
    "name, content, extra, needles",
    [
        ("bad.txt", "5\n7\nseven\n", [], ["bad.txt:3", "seven"]),
        ("neg.txt", "5\n-7\n", [], ["neg.txt:2", "negative"]),
        ("empty.txt", "\n\n", [], ["empty.txt", "no lengths"]),
        ("bad.jsonl", '{"n": 1}\n{"n": \n', ["--field", "n"], ["bad.jsonl:2", "not valid JSON"]),
        ("nofield.jsonl", '{"n": 1}\n{"m": 2}\n', ["--field", "n"], ["nofield.jsonl:2", "no field 'n'"]),
        ("object.jsonl", '{"n": 1}\n', [], ["object.jsonl:1", "--field"]),
        ("str.jsonl", '"abc"\n', [], ["str.jsonl:1", "'abc'"]),
        ("binary.txt", b"\xff\xfe\x00\x01", [], ["binary.txt", "not a UTF-8 text file"]),
        ("broken.npy", b"not numpy", [], ["broken.npy", ".npy"]),
    ],
)
def test_malformed_input_names_file_and_line(tmp_path, name, content, extra, needles):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert_clean_failure(call("plan", str(path), *extra), *needles)


def test_npy_of_wrong_shape(tmp_path):
    path = tmp_path / "two_d.npy"
    np.save(path, np.ones((2, 3), dtype=np.int64))
    assert_clean_failure(call("plan", str(path)), "two_d.npy", "1-D")


def test_missing_file():
    assert_clean_failure(call("plan", "does/not/exist.txt"), "does/not/exist.txt", "no such file")


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--max-token-len", "0"], ["argument --max-token-len: must be an integer from 1 to"]),
        (["--group-size", "7"], ["--group-size 7 does not divide the number of samples 800"]),
        (["--group-size", "0"], ["argument --group-size: must be an integer from 1"]),
        (["--divisible-by", "0"], ["argument --divisible-by: must be an integer from 1"]),
        (["--min-micro-batches", "801"], ["Cannot satisfy max_token_len=4096"]),
        (["--dp", "8", "--min-micro-batches", "101", "--route", "contiguous"], ["rank 7: Cannot satisfy max_token_len=4096"]),
        (["--dp", "0"], ["argument --dp: must be an integer from 1"]),
        (["--dp", "801"], ["cannot split 800 group(s)"]),
    ],
)
def test_impossible_settings_exit_2_with_library_explanation(args, needles):
    assert_clean_failure(call("plan", *args), *needles)


def test_library_message_is_printed_verbatim():
    from seqbal import MicroBatchPlanError, plan_micro_batches

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    with pytest.raises(MicroBatchPlanError) as error:
        plan_micro_batches(lengths, 4096, min_num_micro_batch=801)
    result = call("plan", "--min-micro-batches", "801")
    assert_clean_failure(result, str(error.value))


def test_argparse_errors_exit_2():
    assert_clean_failure(call("plan", "--max-token-len", "lots"), "argument --max-token-len: expected an integer, got 'lots'")
    assert_clean_failure(call(), "plan")
    assert_clean_failure(call("plan", "--dp"), "expected one argument")


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "fill.png"
    result = call("plan", "--dp", "2", "--plot", str(path))
    assert result.returncode == 0, result.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {path}" in result.stdout


def test_plot_without_matplotlib_is_explained(tmp_path):
    path = tmp_path / "fill.png"
    result = run("plan", "--plot", str(path), python_prefix="import sys; sys.modules['matplotlib'] = None")
    assert_clean_failure(result, "matplotlib", "seqbal[plot]")
    assert not path.exists()


def test_console_script_entry_point_is_declared():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert "seqbal = seqbal.cli:main" in config["options.entry_points"]["console_scripts"]
    assert "data/*.txt" in config["options.package_data"]["seqbal"]


def test_report_when_the_verl_loops_fail(tmp_path):
    from seqbal.cli import format_report

    path = tmp_path / "lengths.txt"
    path.write_text("5\n7\n3\n")
    report = plan_json(str(path), "--max-token-len", "8")
    report["verl_0_9"].update(ranks=[], micro_batches_per_rank=None, failed_at=4, kk_passes=2)
    report["verl_0_8"].update(failed=True)
    text = format_report(report)
    assert "seqbal: 2 micro-batches per rank" in text
    assert "verl >= 0.9 (strict loop): fails, it reaches 4 micro-batches" in text
    assert "verl <= 0.8 (one KK pass): fails" in text


# ---------------------------------------------------------------------------------------------
# Bad input of every kind: exit 2, one line, never a traceback or "internal error"
# ---------------------------------------------------------------------------------------------

BIG = "1234567890123456789012345678901234567890"


@pytest.mark.parametrize(
    "name, content, extra, needles",
    [
        ("digits.txt", f"5\n{BIG}\n", [], ["digits.txt:2", "too large"]),
        ("int64.txt", f"5\n{2**63}\n", [], ["int64.txt:2", f"length {2**63} is too large"]),
        ("int64.jsonl", f"5\n{2**63}\n", [], ["int64.jsonl:2", "too large"]),
        ("field.jsonl", f'{{"n": {2**63}}}\n', ["--field", "n"], ["field.jsonl:1", "too large"]),
        ("float.jsonl", "5\n1e300\n", [], ["float.jsonl:2", "too large"]),
        ("nan.jsonl", "5\nNaN\n", [], ["nan.jsonl:2", "expected an integer length"]),
        ("deep.jsonl", "[" * 100000 + "]" * 100000 + "\n", [], ["deep.jsonl:1", "not valid JSON"]),
        ("sum.txt", f"{2**62}\n{2**62}\n", [], ["sum.txt", "add up to 9223372036854775808 tokens"]),
        ("square.txt", "3037000500\n3037000500\n", ["--max-token-len", str(2**63 - 1)],
         ["square.txt", "overflow the workload model", "longest is 3037000500 tokens (line 1)"]),
        ("wraps.txt", f"{2**32}\n5\n", ["--max-token-len", str(2**63 - 1)], ["wraps.txt", "overflow the workload model"]),
        ("field_on_text.txt", "5\n", ["--field", "n"], ["field_on_text.txt", "--field applies to .jsonl"]),
        ("column_on_jsonl.jsonl", "5\n", ["--column", "n"], ["column_on_jsonl.jsonl", "--column applies to .parquet"]),
        ("empty_name.jsonl", '{"n": 1}\n', ["--field", "n+"], ["--field 'n+'", "empty name"]),
    ],
)
def test_bad_lengths_exit_2_with_one_line(tmp_path, name, content, extra, needles):
    path = tmp_path / name
    path.write_text(content)
    result = call("plan", str(path), *extra)
    assert_clean_failure(result, *needles)
    assert "internal error" not in result.stderr


@pytest.mark.parametrize(
    "array, needles",
    [
        (np.array([5, 2**64 - 5], dtype=np.uint64), ["element 1", "too large"]),
        (np.array([5.0, 1e300]), ["element 1", "too large"]),
        (np.array([5.0, np.nan]), ["element 1", "expected an integer length"]),
        (np.array([5.0, -3.0]), ["element 1", "negative length"]),
        (np.array([True, False]), ["expected integer lengths, got dtype bool"]),
    ],
    ids=["uint64", "1e300", "nan", "negative-float", "bool"],
)
def test_bad_npy_values_are_named_truthfully(tmp_path, array, needles):
    path = tmp_path / "lengths.npy"
    np.save(path, array)
    result = call("plan", str(path))
    assert_clean_failure(result, *needles)
    if "negative" not in needles[-1]:
        assert "negative" not in result.stderr  # a huge unsigned or float value is not "negative"


def test_parquet_value_too_large(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "lengths.parquet"
    pq.write_table(pa.table({"n": pa.array([5, 2**64 - 1], type=pa.uint64())}), path)
    assert_clean_failure(call("plan", str(path), "--column", "n"), "row 1", "too large")


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--max-token-len", str(2**63)], ["argument --max-token-len", str(2**63)]),
        (["--max-token-len", BIG], ["argument --max-token-len"]),
        (["--seed", "-1"], ["argument --seed: must be an integer from 0"]),
        (["--dp", "-3"], ["argument --dp"]),
        (["--plot", "x.txt"], ["--plot x.txt", ".png"]),
        (["--route", "random"], ["argument --route: invalid choice"]),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, needles):
    result = call("plan", *args)
    assert_clean_failure(result, *needles)
    assert result.stdout == ""


def test_forty_digit_length_in_a_real_process(tmp_path):
    """The launch path a user takes (console module, real stderr), not only ``main()``."""
    path = tmp_path / "lengths.txt"
    path.write_text(f"5\n{BIG}\n")
    assert_clean_failure(run("plan", str(path)), "lengths.txt:2", "too large")


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_bytes("\ufeff5\n7\n3\n".encode("utf-8"))
    report = plan_json(str(path), "--max-token-len", "8")
    assert report["input"]["tokens"] == 15


def test_version():
    import seqbal

    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"seqbal {seqbal.__version__}"


def test_stdin_text_and_jsonl():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "seqbal", "plan", "-", "--max-token-len", "8", "--json"]
    text = subprocess.run(command, input="\ufeff5\n7\n# note\n3\n", cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    report = json.loads(text.stdout)
    assert report["input"]["file"] == "<stdin>" and report["input"]["tokens"] == 15
    records = "".join(json.dumps({"p": p, "r": r}) + "\n" for p, r in [(2, 3), (4, 3), (1, 2)])
    jsonl = subprocess.run(command + ["--field", "p+r"], input=records, cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=60)
    assert jsonl.returncode == 0, jsonl.stderr
    assert json.loads(jsonl.stdout)["input"]["tokens"] == 15


def test_field_takes_a_sum_of_fields(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rows = [{"prompt_len": 3, "response_len": 4}, {"prompt_len": 1, "response_len": [9, 9]}, {"prompt_len": 5, "response_len": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = plan_json(str(path), "--field", "prompt_len+response_len", "--max-token-len", "8")
    assert report["input"]["tokens"] == 3 + 4 + 1 + 2 + 5 + 0
    assert report["input"]["max_length"] == 7
    assert_clean_failure(call("plan", str(path), "--field", "prompt_len+reply_len"), "rollouts.jsonl:1", "no field 'reply_len'")


def test_plot_without_extension_writes_png_and_says_so(tmp_path):
    pytest.importorskip("matplotlib")
    result = call("plan", "--compare", "off", "--plot", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    written = tmp_path / "out.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {written}" in result.stdout


# ---------------------------------------------------------------------------------------------
# Samples and groups over the cap are named by their place in the user's file
# ---------------------------------------------------------------------------------------------


def test_samples_over_the_cap_are_named_by_file_line(tmp_path):
    path = tmp_path / "lengths.txt"
    # line:   1          2  3  4   5  6   7  8  9
    path.write_text("# header\n5\n\n30\n4\n50\n3\n2\n6\n")
    result = call("plan", str(path), "--max-token-len", "10", "--dp", "2", "--seed", "1")
    assert_clean_failure(result, "2 sample(s) over --max-token-len 10", "the largest has 50 tokens (line 6)",
                         "over: line 4, line 6", "raise --max-token-len to at least 50")


def test_groups_over_the_cap_are_named_by_file_lines(tmp_path):
    path = tmp_path / "lengths.jsonl"
    lengths = [1, 1, 6, 6, 2, 2, 9, 9]  # groups of 2: tokens 2, 12, 4, 18
    path.write_text("\n".join(str(n) for n in lengths[:4]) + "\n\n" + "\n".join(str(n) for n in lengths[4:]) + "\n")
    result = call("plan", str(path), "--max-token-len", "10", "--group-size", "2", "--dp", "2", "--seed", "0")
    assert_clean_failure(result, "2 group(s) of 2 consecutive samples over --max-token-len 10",
                         "the largest has 18 tokens (lines 8-9)", "over: lines 3-4, lines 8-9", "lower --group-size")


def test_npy_places_are_element_indices(tmp_path):
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([1, 2, 30, 4], dtype=np.int64))
    assert_clean_failure(call("plan", str(path), "--max-token-len", "10"), "(element 2)")


# ---------------------------------------------------------------------------------------------
# Routes to the ranks, and the comparison rule
# ---------------------------------------------------------------------------------------------


def test_default_route_is_verls_balance_batch():
    from seqbal import balance_batch

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    report = plan_json("--dp", "4")
    assert report["settings"]["route"] == "balance_batch"
    parts, _ = balance_batch(lengths, 4)
    assert [r["tokens"] for r in report["seqbal"]["ranks"]] == [int(lengths[p].sum()) for p in parts]


@pytest.mark.parametrize("route", ["contiguous", "balance_batch", "schedule"])
def test_every_route_covers_the_input_once(route):
    from seqbal.cli import split_over_ranks

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    split = split_over_ranks(lengths, 4, group_size=8, seed=2, route=route, max_token_len=16384, num_batches_divided_by=2)
    merged = np.concatenate(split.indices)
    assert sorted(merged.tolist()) == list(range(len(lengths)))
    for rank_lengths, positions in zip(split.lengths, split.indices):
        assert np.array_equal(rank_lengths, lengths[positions])
        groups = positions.reshape(-1, 8)
        assert (groups // 8 == groups[:, :1] // 8).all(), "forced groups stay whole and consecutive"
    report = plan_json("--dp", "4", "--group-size", "8", "--seed", "2", "--max-token-len", "16384",
                       "--divisible-by", "2", "--route", route)
    rows = report["seqbal"]["ranks"]
    assert [r["tokens"] for r in rows] == [int(c.sum()) for c in split.lengths]
    assert len({r["micro_batches"] for r in rows}) == 1 and rows[0]["micro_batches"] % 2 == 0
    assert all(r["largest_micro_batch"] <= 16384 for r in rows)
    assert report["routes"][route]["micro_batches_per_rank"] == report["seqbal"]["micro_batches_per_rank"]


def test_schedule_route_is_build_dp_schedule():
    from seqbal import build_dp_schedule

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    report = plan_json("--dp", "8", "--route", "schedule")
    assert report["seqbal"]["micro_batches_per_rank"] == build_dp_schedule(lengths, 8, 4096).num_micro_batches
    assert report["seqbal"]["all_reduces"] == 0


def test_routes_are_compared_in_the_text_output():
    out = call("plan", "--dp", "8").stdout
    assert "ranks split by balance_batch (verl's driver-side default)" in out
    for name in ("balance_batch (verl's driver-side default)", "contiguous chunks", "build_dp_schedule (global, on the driver)"):
        assert re.search(rf"^  {re.escape(name)}\s+\d+\s+[\d.]+%\s+[\d.]+", out, re.M), name


def test_compare_rule_skips_the_verl_loops_above_the_threshold(tmp_path, monkeypatch):
    import seqbal.cli as cli

    def fail(*args, **kwargs):
        raise AssertionError("the comparison must not run")

    path = tmp_path / "many.txt"
    path.write_text("3\n" * (cli.COMPARE_AUTO_MAX_SAMPLES + 1))
    monkeypatch.setattr(cli, "kk_loop_plans", fail)
    monkeypatch.setattr(cli, "kk_one_pass_plans", fail)
    result = call("plan", str(path), "--dp", "2")
    assert result.returncode == 0, result.stderr
    assert f"comparison with verl and the other routes skipped (more than {cli.COMPARE_AUTO_MAX_SAMPLES} samples" in result.stdout
    report = plan_json("--compare", "off")
    assert report["verl_0_9"] is None and report["verl_0_8"] is None and report["routes"] is None
    monkeypatch.undo()
    path.write_text("3\n" * (cli.COMPARE_AUTO_MAX_SAMPLES + 1))
    forced = plan_json(str(path), "--compare", "on")
    assert forced["verl_0_9"]["micro_batches_per_rank"] == forced["seqbal"]["micro_batches_per_rank"]


def test_one_pass_baseline_is_verl_0_8():
    """ceildiv count, KK on workloads, no check: the shipped sample overshoots 64 times."""
    from seqbal import calculate_workload, ceildiv, karmarkar_karp
    from seqbal._kk_loop import kk_one_pass_plans

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    result = kk_one_pass_plans([lengths], 4096)
    expected = karmarkar_karp(calculate_workload(lengths), ceildiv(int(lengths.sum()), 4096), equal_size=False)
    assert result.parts == [[sorted(p) for p in expected]]
    assert (result.count, result.over_cap, result.largest) == (94, 64, 4136)


def test_planning_from_the_command_line_does_not_import_torch(tmp_path):
    """`seqbal plan` with ranks, every route and the comparison needs only NumPy."""
    code = (
        "import contextlib, io, sys\n"
        "from seqbal.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['plan', '--dp', '2', '--compare', 'on']) == 0\n"
        "print(sorted(m for m in ('torch', 'tensordict') if m in sys.modules))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"



def test_plan_on_the_padded_cost_bounds_padded_memory(tmp_path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(x) for x in [3000] * 4 + [200] * 60) + "\n")
    report = plan_json(str(lengths), "--max-token-len", "4096", "--cost", "padded", "--compare", "on")
    assert report["settings"]["cost_model"] == "padded cost (samples x longest)"
    assert report["seqbal"]["micro_batches_per_rank"] == 7  # exact: 4 long alone, 60 short in 3
    assert report["seqbal"]["ranks"][0]["largest_cost"] <= 4096
    assert report["seqbal"]["ranks"][0]["over_cap"] == 0
    assert report["verl_0_9"]["ranks"][0]["over_cap"] > 0  # verl plans tokens: padded memory overshoots
    text = call("plan", str(lengths), "--max-token-len", "4096", "--cost", "padded", "--compare", "on").stdout
    assert "on the padded cost (samples x longest)" in text and "largest cost" in text
    assert "exceed max_token_len on the padded cost" in text


@pytest.mark.parametrize(
    ("options", "expected"),
    [([], 2), (["--round-to", "8"], 2), (["--pack-round-to", "16"], 2), (["--round-to", "16"], 4),
     (["--round-to", "8", "--pack-round-to", "32"], 1), (["--cost", "padded", "--round-to", "8"], 2)],
)
def test_rounding_options_reach_the_plan(tmp_path, options: list[str], expected: int) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("5\n5\n5\n5\n")
    cap = "32" if "32" in options else "16"
    report = plan_json(str(lengths), "--max-token-len", cap, *options)
    assert report["seqbal"]["micro_batches_per_rank"] == expected


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cost", "padded", "--pack-round-to", "4"], "pack_round_to=4 applies to the token cost only"),
        (["--cost", "pad"], "invalid choice: 'pad'"),
        (["--max-token-len", "3000", "--cost", "padded", "--round-to", "1024"],
         "the largest costs 4096 under the padded cost"),
    ],
)
def test_bad_cost_options_exit_2_with_one_line(args: list[str], needle: str) -> None:
    assert_clean_failure(call("plan", *args), needle)
