"""`seqbal plan` driven as a user drives it: a subprocess, its output and its exit code."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import numpy as np

import pytest

from .invariants import assert_plan_invariants

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = Path(str(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt"))  # the installed package's copy


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


PHASE_LINE = re.compile(r"seqbal: [^\n]+ \.\.\.")


def assert_only_phase_lines(stderr: str) -> None:
    """Standard error of a piped run holds nothing but whole progress lines, one per phase."""
    assert stderr == "" or stderr.endswith("\n"), stderr
    for line in stderr.splitlines():
        assert PHASE_LINE.fullmatch(line), (line, stderr)


def plan_json(*args: str) -> dict:
    result = call("plan", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def rank_parts(lengths: np.ndarray, tokens_per_micro_batch: list[int]) -> None:
    """Cheap cross-check: the reported micro-batch tokens add up to the rank's tokens."""
    assert sum(tokens_per_micro_batch) == int(lengths.sum())


VERL = r"(?:verl 0\.9\.1|verl >= 0\.9)"  # verl's own code where installed, else the re-implementation


def test_default_sample_prints_seqbal_and_both_verl_versions():
    result = run("plan", timeout=300)
    assert result.returncode == 0, result.stderr
    assert_only_phase_lines(result.stderr)  # progress, one line a phase, and no verl import warnings
    out = result.stdout
    assert "qwen25math_cot_rollouts.txt (shipped sample): 800 samples, 383611 tokens" in out
    # the report leads with what changes for the user: count, largest micro-batch, time, impossible input
    head = out.split("seqbal: 94 micro-batches per rank")[0]
    flat = " ".join(out.split())
    assert re.search(rf"planning time \(one rank, on this machine\): seqbal \d+ ms, {VERL} \d+(\.\d)? m?s, "
                     r"verl <= 0\.8 \d+(\.\d)? m?s\.", flat)
    assert re.search(r"^  seqbal\s+94\s+4096 \(cap 4096\)$", head, re.M)
    assert re.search(rf"^  {VERL} \(strict loop\)\s+96\s+\d+$", head, re.M)
    assert re.search(r"^  verl <= 0\.8 \(one pass\)\s+94\s+4136, 64 over the cap$", head, re.M)
    assert "a sample over the cap: seqbal raises a ValueError on every rank" in " ".join(head.split())
    assert re.search(rf"^{VERL} ran: ", head, re.M)
    assert re.search(rf"{VERL} \(strict loop\): 96 micro-batches per rank, 3 KK pass\(es\) \(\d+(\.\d)? m?s\)", flat)
    # verl <= 0.8: one KK pass at ceildiv(383611, 4096) = 94 parts, 64 of them over the cap
    assert "verl <= 0.8 (one KK pass): 94 micro-batches per rank, 64 over the cap, largest 4136" in flat
    assert all(len(line) <= 80 for line in out.splitlines()), [line for line in out.splitlines() if len(line) > 80]
    for title in ("samples", "tokens", "packing", "bound", "micro-", "batches", "fill", "workload", "max/mean", "largest"):
        assert title in out, title
    assert "max_token_len=4096 (the default; --max-token-len sets it)" in out


def test_json_matches_library_and_agreement_rule():
    from seqbal import packing_lower_bound, plan_micro_batches

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
        assert row["ceildiv_bound"] == -(-int(chunk.sum()) // 8192)
        assert row["packing_bound"] == packing_lower_bound(chunk, 8192)
        assert row["largest_micro_batch"] <= 8192
        rank_parts(chunk, row["micro_batch_tokens"])
    old = report["verl_0_9"]
    assert old["kk_passes"] >= 1 and old["micro_batches_per_rank"] % 2 == 0
    assert all(r["largest_micro_batch"] <= 8192 for r in old["ranks"])
    assert report["verl_0_8"]["micro_batches_per_rank"] % 2 == 0


def test_subprocess_json_and_malformed_input(tmp_path):
    result = run("plan", "--json", "--dp", "2", "--compare", "off")
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


@pytest.mark.parametrize("route", ["balance_batch", "schedule"])
def test_sample_cap_reaches_the_planner_and_the_report(route):
    """--max-samples-per-micro-batch: the same plan as the library, its most samples shown
    against the cap, and the bound counting it."""
    from seqbal.cli import simulate_ranks, split_over_ranks

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    split = split_over_ranks(lengths, 2, group_size=2, route=route, max_token_len=16384, max_samples_per_micro_batch=6)
    plans = split.plans or simulate_ranks(split.lengths, 16384, force_group_size=2, max_samples_per_micro_batch=6)
    for rank_lengths, parts in zip(split.lengths, plans):
        assert_plan_invariants(rank_lengths, parts, 16384, force_group_size=2, max_samples_per_micro_batch=6)
    args = ("--dp", "2", "--group-size", "2", "--max-token-len", "16384", "--max-samples-per-micro-batch", "6",
            "--route", route, "--compare", "off")
    report = plan_json(*args)
    assert report["settings"]["max_samples_per_micro_batch"] == 6
    rows = report["seqbal"]["ranks"]
    assert [r["micro_batches"] for r in rows] == [len(p) for p in plans]
    assert [r["most_samples"] for r in rows] == [max(map(len, p)) for p in plans]
    assert all(r["most_samples"] <= 6 and r["packing_bound"] >= -(-r["samples"] // 6) for r in rows)
    text = call("plan", *args).stdout
    assert "max samples per micro-batch=6" in " ".join(text.split()) and "most samples" in text and "(cap 6)" in text
    assert "most samples" not in call("plan", "--compare", "off").stdout  # no column without the cap
    assert_clean_failure(call("plan", "--group-size", "4", "--max-token-len", "16384", "--max-samples-per-micro-batch", "3"),
                         "forced group of 4 samples exceeds max_samples_per_micro_batch=3")
    assert_clean_failure(call("plan", "--max-samples-per-micro-batch", "0"),
                         "argument --max-samples-per-micro-batch: must be a positive integer")


def test_the_comparison_says_verl_has_no_sample_cap():
    """verl's count plans tokens alone: under --max-samples-per-micro-batch the report says so
    beside the counts, and says nothing of it without the flag."""
    capped = call("plan", "--max-token-len", "8192", "--max-samples-per-micro-batch", "8").stdout
    capped = " ".join(capped.split())
    assert "has no cap on samples per micro-batch" in capped and "max_samples_per_micro_batch=8" in capped
    assert "no cap on samples" not in call("plan", "--max-token-len", "8192").stdout


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
    assert row["ceildiv_bound"] == 7 and row["packing_bound"] == 8 and row["micro_batches"] == 8


def test_parquet_without_pyarrow_is_explained(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "lengths.parquet"
    path.write_bytes(b"PAR1")
    result = call("plan", str(path), "--column", "n")
    assert_clean_failure(result, str(path), "pip install pyarrow")


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
        (["--max-token-len", "0"], ["argument --max-token-len: must be a positive integer"]),
        (["--group-size", "7"], ["--group-size 7 does not divide the number of samples 800"]),
        (["--group-size", "0"], ["argument --group-size: must be a positive integer"]),
        (["--divisible-by", "0"], ["argument --divisible-by: must be a positive integer"]),
        (["--min-micro-batches", "801"], ["Cannot satisfy max_token_len=4096"]),
        (["--dp", "8", "--min-micro-batches", "101", "--route", "contiguous"], ["rank 7: Cannot satisfy max_token_len=4096"]),
        (["--dp", "0"], ["argument --dp: must be a positive integer"]),
        (["--dp", "801"], ["cannot split 800 group(s)"]),
        (["--dp", "10000"], ["over --dp 10000 ranks", "--dp can be at most 800 here"]),
        (["--group-size", "8", "--dp", "101"], ["cannot split 100 group(s) of 8 sample(s)", "--dp can be at most 100 here"]),
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
    assert_clean_failure(result, "pip install matplotlib")
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
    assert re.search(rf"^{VERL} \(strict loop\): fails, it reaches 4 micro-batches", text, re.M)
    assert re.search(rf"^  {VERL} \(strict loop\)\s+fails at 4\s+fails at 4$", text, re.M)
    assert re.search(r"^  verl <= 0\.8 \(one pass\)\s+fails\s+fails$", text, re.M)
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
        (["--seed", "-1"], ["argument --seed: must be a non-negative integer"]),
        (["--dp", "-3"], ["argument --dp"]),
        (["--plot", "x.txt"], ["--plot x.txt", ".png"]),
        (["--route", "random"], ["argument --route: invalid choice"]),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, needles):
    result = call("plan", *args)
    assert_clean_failure(result, *needles)
    assert result.stdout == ""
    assert "9223372036854775807" not in result.stderr  # an argument's range says "a positive integer"


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
    command = [sys.executable, "-m", "seqbal", "plan", "-", "--max-token-len", "8", "--json", "--compare", "off"]
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
    assert "ranks split by balance_batch (verl's driver-side default)" in " ".join(out.split())
    for name in ("balance_batch", "contiguous", "schedule"):
        assert re.search(rf"^  {re.escape(name)}\s+\d+\s+[\d.]+%\s+[\d.]+", out, re.M), name
    assert re.search(r"^  balance_batch\s+\d+\s+[\d.]+%\s+[\d.]+\s+\(shown above\)$", out, re.M)


def test_compare_rule_skips_verl_when_its_kk_would_be_large(tmp_path, monkeypatch):
    """auto compares while verl's KK builds at most COMPARE_AUTO_MAX_KK_SETS sets per pass."""
    import seqbal.cli as cli

    def fail(*args, **kwargs):
        raise AssertionError("the comparison must not run")

    # 2 ranks x 1,000 samples x ceildiv(1000 * 1000, 4096) = 245 micro-batches: 490,000 sets
    path = tmp_path / "many.txt"
    path.write_text("1000\n" * 2000)
    assert cli.kk_sets_per_pass([np.full(1000, 1000)] * 2, 4096) == 490_000 > cli.COMPARE_AUTO_MAX_KK_SETS
    monkeypatch.setattr(cli.report, "_compare_with_verl", fail)  # where build_report looks it up
    result = call("plan", str(path), "--dp", "2")
    assert result.returncode == 0, result.stderr
    assert ("comparison with verl and the other routes skipped: verl's Karmarkar-Karp would build 490,000 sets "
            "per pass here") in " ".join(result.stdout.split())
    report = plan_json("--compare", "off")
    assert report["verl_0_9"] is None and report["verl_0_8"] is None and report["routes"] is None
    assert report["settings"]["kk_sets_per_pass"] == 800 * 94
    monkeypatch.undo()
    small = tmp_path / "small.txt"
    small.write_text("3\n" * 40)
    forced = plan_json(str(small), "--compare", "on", "--max-token-len", "8")
    assert forced["verl_0_9"]["micro_batches_per_rank"] == forced["seqbal"]["micro_batches_per_rank"] == 20


def test_one_pass_baseline_is_verl_0_8():
    """ceildiv count, KK on workloads, no check: the shipped sample overshoots 64 times."""
    from seqbal import calculate_workload, ceildiv, karmarkar_karp
    from seqbal.cli.kk_loop import kk_one_pass_plans

    lengths = np.loadtxt(SAMPLE, dtype=np.int64)
    result = kk_one_pass_plans([lengths], 4096)
    assert (result.count, result.over_cap, result.largest) == (94, 64, 4136)
    # seqbal's own KK (a faster one, same rule) makes as many over the cap
    fast = karmarkar_karp(calculate_workload(lengths), ceildiv(int(lengths.sum()), 4096), equal_size=False)
    assert sum(int(lengths[p].sum()) > 4096 for p in fast) == 64
    try:
        import verl.utils.seqlen_balancing as verl_balancing
    except ImportError:
        return
    workloads = calculate_workload(lengths).tolist()
    assert result.parts[0] == verl_balancing.get_seqlen_balanced_partitions(workloads, 94, equal_size=False)


def _modules_after(argv: list[str], hide_verl: bool = False) -> list[str]:
    code = (
        "import contextlib, io, sys\n"
        + ("sys.modules['verl'] = None\n" if hide_verl else "")
        + "from seqbal.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main({argv!r}) == 0\n"
        "print(sorted(m for m in ('torch', 'tensordict', 'verl') if sys.modules.get(m) is not None))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_planning_from_the_command_line_does_not_import_torch():
    """`seqbal plan` with ranks and every route needs only NumPy; torch and verl are imported
    for the comparison with verl only."""
    assert _modules_after(["plan", "--dp", "2", "--compare", "off"]) == []
    assert _modules_after(["plan", "--dp", "2", "--route", "schedule", "--compare", "off"]) == []
    # the re-implementation runs where verl's code would, next to torch: but never imports verl
    assert _modules_after(["plan", "--dp", "2", "--compare", "on", "--max-token-len", "16384"], hide_verl=True) == [
        "tensordict", "torch"]


def test_plan_on_the_padded_cost_bounds_padded_memory(tmp_path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(x) for x in [3000] * 4 + [200] * 60) + "\n")
    report = plan_json(str(lengths), "--max-token-len", "4096", "--cost", "padded", "--compare", "on")
    assert report["settings"]["cost_model"] == "padded cost (samples x longest)"
    assert report["seqbal"]["micro_batches_per_rank"] == 7  # exact: 4 long alone, 60 short in 3
    # the bound column is the bound of the chosen cost (7), not the token bound ceildiv(24000, 4096) = 6
    assert report["seqbal"]["ranks"][0]["packing_bound"] == 7
    assert report["seqbal"]["ranks"][0]["ceildiv_bound"] == 6
    assert report["seqbal"]["ranks"][0]["largest_cost"] <= 4096
    assert report["seqbal"]["ranks"][0]["over_cap"] == 0
    assert report["verl_0_9"]["ranks"][0]["over_cap"] > 0  # verl plans tokens: padded memory overshoots
    text = call("plan", str(lengths), "--max-token-len", "4096", "--cost", "padded", "--compare", "on", "--width", "200").stdout
    text = " ".join(text.split())
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


# ---------------------------------------------------------------------------------------------
# The verl column is verl's own code, or a re-implementation that costs what verl costs
# ---------------------------------------------------------------------------------------------


def _verl_code():
    from seqbal.cli.verl_run import load_verl

    code = load_verl()
    if code.module is None:
        pytest.skip(code.reason)
    return code


def _resampled(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(np.loadtxt(SAMPLE, dtype=np.int64), n)


@pytest.mark.parametrize(
    ("dp", "n", "cap", "group", "divisible", "minimum"),
    [(1, 800, 4096, 1, None, None), (2, 480, 4096, 1, 3, None), (4, 640, 16384, 8, 2, None), (3, 300, 8192, 2, None, 9)],
)
def test_reimplementation_partitions_like_verl(dp, n, cap, group, divisible, minimum):
    """Same micro-batches as verl 0.9.1's rearrange_micro_batches, synced ranks included; the
    one pass of verl <= 0.8 likewise with verl's KK and with the re-implemented one."""
    from seqbal.cli.verl_run import one_pass_0_8, reimplemented_strict_loop, verl_strict_loop
    from seqbal.cli import _OneTorchThread, split_over_ranks

    code = _verl_code()
    lengths = np.loadtxt(SAMPLE, dtype=np.int64) if n == 800 else _resampled(n, n)
    split = split_over_ranks(lengths, dp, group_size=group, seed=1)
    options = dict(force_group_size=group, num_batches_divided_by=divisible, min_num_micro_batch=minimum)
    with _OneTorchThread():
        theirs = verl_strict_loop(code, split.lengths, cap, **options)
        ours = reimplemented_strict_loop(split.lengths, cap, **options)
        old_theirs, _ = one_pass_0_8(code, split.lengths, cap, **options)
        old_ours, _ = one_pass_0_8(None, split.lengths, cap, **options)
    assert theirs.errors == [None] * dp and theirs.parts is not None
    assert ours.parts == theirs.parts  # the same micro-batches, in verl's pipeline order
    assert (ours.passes, ours.all_reduces) == (theirs.passes, theirs.all_reduces)
    assert old_ours.parts == old_theirs.parts and old_ours.count == old_theirs.count
    if n == 800:
        assert (len(theirs.parts[0]), theirs.passes) == (96, 3)


def _median_ratio(first, second, rounds: int) -> float:
    """Median over rounds of time(second) / time(first), the two run back to back each round."""
    import time

    ratios = []
    for _ in range(rounds):
        start = time.perf_counter()
        first()
        middle = time.perf_counter()
        second()
        ratios.append((time.perf_counter() - middle) / (middle - start))
    return sorted(ratios)[len(ratios) // 2]


def test_reimplementation_costs_what_verl_costs_side_by_side():
    """The fallback must not be a faster verl: within 2x of verl's own call on the same lengths,
    both ways (the median of 5 back-to-back rounds; typical ratio 0.8-1.2 on a busy machine)."""
    from seqbal.cli.verl_run import reimplemented_strict_loop, verl_strict_loop
    from seqbal.cli import _OneTorchThread

    code = _verl_code()
    ranks = [_resampled(400, 7), _resampled(400, 8)]  # 2 synced ranks, 47 micro-batches, 2-3 passes
    with _OneTorchThread():
        ratio = _median_ratio(lambda: verl_strict_loop(code, ranks, 4096),
                              lambda: reimplemented_strict_loop(ranks, 4096), rounds=5)
    assert 0.5 <= ratio <= 2.0, ratio


def test_fallback_in_its_own_process_costs_what_verl_costs():
    """As the CLI runs them: verl's code in a process that imported verl; the re-implementation in
    one where verl is absent. Each times 3 calls on the same lengths in CPU time (both loops run
    on one thread; wall time moved with whatever ran beside the test, and once read 2.15x under
    a parallel suite); medians within 2x."""
    _verl_code()
    script = (
        "import sys, time, numpy as np\n"
        "{hide}"
        "from seqbal.cli.verl_run import load_verl, reimplemented_strict_loop, verl_strict_loop\n"
        "from seqbal.cli import _OneTorchThread\n"
        "rng = np.random.default_rng(7)\n"
        f"lengths = rng.choice(np.loadtxt({str(SAMPLE)!r}, dtype=np.int64), 600)\n"
        "code = load_verl()\n"
        "run = (lambda: verl_strict_loop(code, [lengths], 4096)) if code.module else (lambda: reimplemented_strict_loop([lengths], 4096))\n"
        "times = []\n"
        "with _OneTorchThread():\n"
        "    for _ in range(3):\n"
        "        start = time.process_time()\n"
        "        run()\n"
        "        times.append(time.process_time() - start)\n"
        "print(sorted(times)[1], code.module is not None)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    seconds = {}
    for hide in ("", "sys.modules['verl'] = None\n"):
        done = subprocess.run([sys.executable, "-c", script.format(hide=hide)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        value, used_verl = done.stdout.split()
        assert used_verl == ("True" if not hide else "False")
        seconds[used_verl] = float(value)
    ratio = seconds["False"] / seconds["True"]
    assert 0.5 <= ratio <= 2.0, seconds


def test_report_says_which_verl_ran(monkeypatch):
    import seqbal.cli as cli
    from seqbal.cli.verl_run import VerlCode

    real = plan_json("--dp", "2", "--max-token-len", "16384")
    assert real["verl_0_9"]["ran"] in ("verl", "reimplementation")
    if real["verl_0_9"]["ran"] == "verl":
        assert real["verl_0_9"]["verl_version"] == "0.9.1"
        assert real["verl_0_9"]["implementation"].startswith("verl 0.9.1's own rearrange_micro_batches")
    monkeypatch.setattr(cli.compare, "load_verl", lambda: VerlCode(reason="verl is not installed"))
    text = call("plan", "--dp", "2", "--max-token-len", "16384").stdout
    flat = " ".join(text.split())
    assert "verl >= 0.9 ran: seqbal's re-implementation of verl 0.9.1's rearrange_micro_batches" in flat
    assert "(verl is not installed)" in flat
    assert "verl <= 0.8 ran: seqbal's re-implementation of verl's Karmarkar-Karp" in flat
    fallback = plan_json("--dp", "2", "--max-token-len", "16384")
    assert fallback["verl_0_9"]["ran"] == "reimplementation"
    for key in ("micro_batches_per_rank", "kk_passes", "all_reduces"):
        assert fallback["verl_0_9"][key] == real["verl_0_9"][key], key
    assert fallback["verl_0_8"]["micro_batches_per_rank"] == real["verl_0_8"]["micro_batches_per_rank"]


def test_verl_asserts_on_one_rank_and_leaves_the_other_waiting():
    """What the report says of an impossible input, checked on verl's own code: the rank with a
    sample over the cap raises before the first all-reduce, the other is left waiting in it;
    seqbal raises on every rank."""
    from seqbal import MicroBatchPlanError, plan_data_parallel
    from seqbal.cli.verl_run import verl_strict_loop
    from seqbal.cli import IMPOSSIBLE_INPUT

    code = _verl_code()
    run_ = verl_strict_loop(code, [np.array([5000, 10]), np.array([10, 10])], 4096)
    assert run_.errors[0].startswith("AssertionError: max_token_len must be greater than the sequence length")
    assert run_.left_waiting == [1] and run_.all_reduces == 1  # rank 1 entered the count all-reduce
    assert "AssertionError on the rank that holds it, before its first all-reduce" in IMPOSSIBLE_INPUT["verl"]
    with pytest.raises(MicroBatchPlanError, match="exceeds max_token_len"):
        plan_data_parallel([np.array([5000, 10]), np.array([10, 10])], 4096)


# ---------------------------------------------------------------------------------------------
# Small things a user trips on
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["plan", "--dp", "0"], ["plan", "--max-token-len", "100"], ["plan", "no/such/file.txt"], [],
     ["plan", "--min-micro-batches", "801", "--compare", "off"]],
    ids=["argparse", "over-cap", "missing-file", "no-command", "library"],
)
def test_every_error_has_the_one_prefix(args):
    from seqbal.cli import ERROR_PREFIX

    result = call(*args)
    assert result.returncode == 2
    assert ERROR_PREFIX == "seqbal: error:"
    assert result.stderr.startswith("seqbal: error: ") and "seqbal plan: error" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("content", "tokens", "needle"),
    [("5.0\n7\n4e1\n", 52, None), ("5\n5.5\n", None, "lengths.txt:2: expected an integer length, got 5.5"),
     ("5\nnan\n", None, "lengths.txt:2: expected an integer length, got nan"),
     ("5\n-2.0\n", None, "lengths.txt:2: negative length -2")],
)
def test_text_floats_are_read_like_parquet_floats(tmp_path, content, tokens, needle):
    """Integral floats are lengths in every format; others are errors naming the line or row."""
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    if needle is None:
        assert plan_json(str(path), "--compare", "off")["input"]["tokens"] == tokens
    else:
        assert_clean_failure(call("plan", str(path)), needle)
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    values = [float(line) for line in content.split()]
    table = tmp_path / "lengths.parquet"
    pq.write_table(pa.table({"n": pa.array(values, type=pa.float64())}), table)
    if needle is None:
        assert plan_json(str(table), "--compare", "off")["input"]["tokens"] == tokens
    else:
        assert_clean_failure(call("plan", str(table)), "row 1", needle.split(": ", 1)[1].split(",")[0])


def _run_with_stderr_on_a_terminal(*args: str) -> tuple[int, str, str]:
    import pty

    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, "-m", "seqbal", *args], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    out, _ = process.communicate(timeout=300)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.returncode, out, b"".join(chunks).decode()


def test_progress_goes_to_a_terminal_stderr_only():
    code, out, terminal = _run_with_stderr_on_a_terminal("plan", "--json", "--compare", "off")
    assert code == 0
    json.loads(out)  # standard output is the report only
    assert "seqbal: reading the shipped sample ..." in terminal
    assert "seqbal: planning 800 samples with seqbal ..." in terminal
    assert terminal.endswith("\r\x1b[K")  # the line is erased at the end
    piped = run("plan", "--json", "--compare", "off")
    assert piped.returncode == 0  # a pipe: whole lines, one per phase that lasted, never redrawn
    assert "\r" not in piped.stderr and "[#" not in piped.stderr
    assert_only_phase_lines(piped.stderr)
    quiet = run("plan", "--json", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""
    json.loads(quiet.stdout)


def test_a_slow_phase_is_announced_in_a_pipe_within_a_second(monkeypatch):
    """A pipe is told what is being computed once a phase lasts (0.5 s); a quick phase says nothing."""
    import time

    from seqbal.cli.compare import Progress

    stream = io.StringIO()
    progress = Progress(stream)
    progress.phase("quick")
    progress.phase("slow")
    time.sleep(Progress.LINE_DELAY + 0.7)
    progress.phase("ended before its line was due")
    progress.done()
    assert stream.getvalue() == "seqbal: slow ...\n"


def test_all_zero_lengths_plan_and_skip_the_comparison(tmp_path):
    """verl's own code cannot split all-zero lengths; seqbal plans them, and the comparison is a
    one-line note, never the command's exit."""
    path = tmp_path / "zeros.txt"
    path.write_text("0\n0\n0\n")
    result = call("plan", str(path), "--compare", "on")
    assert result.returncode == 0, result.stderr
    assert "seqbal: 1 micro-batch per rank" in result.stdout
    skipped = [line for line in result.stdout.splitlines() if line.startswith("comparison with verl")]
    assert len(skipped) == 1 and "skipped" in skipped[0], result.stdout
    report = plan_json(str(path), "--compare", "on")
    assert report["verl_0_9"] is None and report["comparison_error"] and not report["settings"]["compare"]


def test_plot_legend_sits_outside_the_bars():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from seqbal.cli import plot_figure

    report = plan_json("--dp", "8")
    figure = plot_figure(report, 4096)
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        for axis in figure.axes:
            box, legend = axis.get_window_extent(renderer), axis.get_legend().get_window_extent(renderer)
            assert legend.x0 >= box.x1, (legend, box)  # right of the panel: covers no bar
            assert len(axis.get_legend().get_texts()) == 9  # 8 ranks and the cap
    finally:
        plt.close(figure)


def test_guide_shows_the_comparison_as_it_runs():
    """docs/guide.md's example with verl (a no-run block: its output depends on verl being
    installed) is the command's real output, planning times aside."""
    _verl_code()
    guide = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    match = re.search(r"```bash no-run\nseqbal plan --dp 2\n```\n\n```text\n(.*?)```", guide, re.S)
    assert match, "the example is in the guide"
    duration = re.compile(r"\b\d+(\.\d+)? (ms|s)\b")
    result = call("plan", "--dp", "2")
    assert result.returncode == 0, result.stderr
    assert duration.sub("<time>", result.stdout.rstrip("\n")) == duration.sub("<time>", match.group(1).rstrip("\n"))


def test_progress_bar_on_a_terminal(tmp_path, monkeypatch):
    """On a terminal the planning phase draws a bar from the count search's reports, up to 100%,
    and erases it at the end; a pipe (every other test here) gets none of it."""
    import seqbal.cli.command as command

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    progress = command.Progress
    monkeypatch.setattr(command, "Progress", lambda quiet=False: progress(terminal, quiet=quiet))  # call() redirects sys.stderr
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(100 + (i * 37) % 900) for i in range(400)) + "\n")
    result = call("plan", str(path), "--dp", "2", "--compare", "off")
    assert result.returncode == 0, result.stderr
    drawn = terminal.getvalue()
    assert "seqbal: planning 400 samples with seqbal [" in drawn and "] 100%" in drawn, drawn
    assert drawn.endswith("\r\033[K") and result.stderr == ""


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("seqbal.cli.lengths", "seqbal.cli.lengths", ["read_lengths", "InputError", "DEFAULT_SAMPLE", "Lengths"]),
        ("seqbal.cli.verl_run", "seqbal.cli.verl_run", ["load_verl", "verl_strict_loop", "one_pass_0_8", "VerlCode"]),
        ("seqbal.cli.kk_loop", "seqbal.cli.kk_loop", ["kk_loop_plans", "kk_one_pass_plans", "verl_karmarkar_karp"]),
    ],
)
def test_the_cli_modules_live_under_the_cli_and_their_old_paths_still_import(old, new, names):
    """The CLI's own modules sit in seqbal/cli/; the old top-level names hand out the same objects."""
    import importlib

    moved, kept = importlib.import_module(new), importlib.import_module(old)
    assert Path(moved.__file__).parent.name == "cli"
    for name in names:
        assert getattr(kept, name) is getattr(moved, name), name
    assert set(names) <= set(dir(kept))


def test_the_shipped_sample_is_found_from_the_moved_reader():
    from seqbal.cli.lengths import DEFAULT_SAMPLE, read_lengths

    assert DEFAULT_SAMPLE.is_file()
    assert len(read_lengths(None).values) == 800


# ---------------------------------------------------------------------------------------------
# The text report on an 80-column terminal, the cap it uses, and routes that cannot plan
# ---------------------------------------------------------------------------------------------


def _long_tail_lengths(n: int = 5000) -> np.ndarray:
    """16k-scale lengths: a long lognormal tail clipped at 16384 (longest exactly 16384)."""
    lengths = np.clip(np.random.default_rng(5).lognormal(7.5, 1.0, n), 16, 16384).astype(np.int64)
    lengths[0] = 16384
    return lengths


def _too_wide(text: str, width: int = 80) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


@pytest.mark.parametrize(
    "options",
    [
        [],  # the cap chosen from the data (16384), the comparison skipped by auto
        ["--max-token-len", "65536"],  # the comparison with verl and the other routes runs
        ["--max-token-len", "65536", "--cost", "padded", "--max-samples-per-micro-batch", "64", "--group-size", "2",
         "--divisible-by", "2", "--min-micro-batches", "3", "--seed", "7", "--compare", "off"],
    ],
    ids=["default", "compared", "every-column"],
)
def test_every_line_fits_80_columns_on_5000_lengths_at_dp_8(tmp_path, monkeypatch, options):
    monkeypatch.chdir(tmp_path)  # the file named as a user names it (a path is never broken)
    np.savetxt("lengths.txt", _long_tail_lengths(), fmt="%d")
    result = call("plan", "lengths.txt", "--dp", "8", *options)
    assert result.returncode == 0, result.stderr
    assert not _too_wide(result.stdout), _too_wide(result.stdout)
    assert len(result.stdout.splitlines()) > 15


@pytest.mark.parametrize("options", [[], ["--dp", "4"], ["--cost", "padded", "--max-samples-per-micro-batch", "8"]])
def test_every_line_fits_80_columns_on_the_shipped_sample(options):
    result = call("plan", *options)
    assert result.returncode == 0, result.stderr
    assert not _too_wide(result.stdout), _too_wide(result.stdout)


def test_a_wider_layout_on_request_and_on_a_wider_terminal(monkeypatch):
    """--width N, or a terminal wider than 80: one-line column titles and unbroken notes; a
    pipe or a narrower terminal gets 80 columns."""
    wide = call("plan", "--dp", "2", "--compare", "off", "--width", "150").stdout
    assert "packing bound  micro-batches  fill %  workload max/mean  largest micro-batch" in wide
    assert max(len(line) for line in wide.splitlines()) > 80
    assert not _too_wide(wide, 150)
    narrow = call("plan", "--dp", "2", "--compare", "off").stdout
    assert "packing bound  micro-batches" not in narrow and not _too_wide(narrow)

    from seqbal.cli import command

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for columns, expected in ((150, 150), (60, 80)):
        monkeypatch.setattr(command.shutil, "get_terminal_size", lambda fallback, c=columns: os.terminal_size((c, 40)))
        monkeypatch.setattr(command.sys, "stdout", Terminal())
        assert command._report_width(None) == expected
        assert command._report_width(100) == 100
    monkeypatch.setattr(command.sys, "stdout", io.StringIO())  # a pipe: never the terminal's width
    assert command._report_width(None) == 80


def test_the_cap_used_without_max_token_len_is_said_and_fits_the_data(tmp_path):
    """Not given: 4096 where every sample fits (and said to be the default), else the smallest
    power of two that holds the longest sample (said so), never an error about a value the
    user never typed."""
    report = plan_json("--compare", "off")
    assert report["settings"]["max_token_len"] == 4096 and report["settings"]["max_token_len_source"] == "default"
    path = tmp_path / "long.txt"
    path.write_text("\n".join(["12000", "300", "9000", "5000"]) + "\n")
    result = call("plan", str(path), "--compare", "off")
    assert result.returncode == 0, result.stderr
    flat = " ".join(result.stdout.split())
    assert ("max_token_len=16384 (--max-token-len not given: the smallest power of two from 4096 up that holds "
            "every sample)") in flat
    report = plan_json(str(path), "--compare", "off")
    assert report["settings"]["max_token_len"] == 16384 and report["settings"]["max_token_len_source"] == "data"
    assert report["seqbal"]["micro_batches_per_rank"] == 2
    given = plan_json(str(path), "--max-token-len", "12000", "--compare", "off")["settings"]
    assert (given["max_token_len"], given["max_token_len_source"]) == (12000, "given")
    assert "the default" not in call("plan", str(path), "--max-token-len", "12000", "--compare", "off").stdout
    # the chosen cost of a forced group counts: padded, groups of two cost 2 x 12000 and 2 x 9000
    pairs = plan_json(str(path), "--group-size", "2", "--cost", "padded", "--compare", "off")["settings"]
    assert (pairs["max_token_len"], pairs["max_token_len_source"]) == (32768, "data")
    assert_clean_failure(call("plan", str(path), "--max-token-len", "4096"), "over --max-token-len 4096")


#: 29 lengths on which, over 4 ranks with at most 3 samples per micro-batch at cap 128,
#: balance_batch leaves one rank a single sample where the others need 9 micro-batches: seqbal
#: cannot plan the ranks it makes, while the schedule route (and contiguous chunks) can.
ROUTE_CASE = [6, 128, 2, 4, 6, 2, 3, 6, 5, 3, 3, 6, 2, 3, 123, 3, 1, 2, 1, 4, 1, 1, 1, 2, 6, 102, 4, 3, 1]


def test_a_comparison_route_that_cannot_plan_is_a_row_not_an_exit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = Path("lengths.txt")
    path.write_text("\n".join(map(str, ROUTE_CASE)) + "\n")
    options = ("--route", "schedule", "--dp", "4", "--max-token-len", "128", "--max-samples-per-micro-batch", "3")
    result = call("plan", str(path), *options)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^  balance_batch\s+cannot plan \(1\)$", out, re.M), out
    assert re.search(r"^  schedule\s+3\s+[\d.]+%\s+[\d.]+\s+\(shown above\)$", out, re.M), out
    assert "(1) balance_batch: seqbal cannot plan the ranks it makes: Cannot satisfy max_token_len=128" in (
        " ".join(out.split()))
    assert not _too_wide(out)
    report = plan_json(str(path), *options)
    assert report["seqbal"]["micro_batches_per_rank"] == 3
    assert report["routes"]["balance_batch"]["micro_batches_per_rank"] is None
    assert "Cannot satisfy max_token_len=128" in report["routes"]["balance_batch"]["error"]
    assert report["routes"]["schedule"]["error"] is None and report["routes"]["schedule"]["micro_batches_per_rank"] == 3
    # the user's own route still fails loudly when it cannot plan
    assert_clean_failure(call("plan", str(path), *options[2:]), "Cannot satisfy max_token_len=128")


@pytest.mark.parametrize("route", ["balance_batch", "schedule"])
def test_order_lists_each_ranks_micro_batches_as_a_trainer_runs_them(route):
    """--order: the same micro-batches, listed in run order; pipeline (default) as the library's
    pipeline plan, largest_first largest first (a schedule's slots by their largest)."""
    from seqbal.cli import simulate_ranks, split_over_ranks

    args = ("--dp", "2", "--max-token-len", "8192", "--route", route, "--compare", "off")
    default, largest = plan_json(*args), plan_json(*args, "--order", "largest_first")
    assert (default["settings"]["order"], default["seqbal"]["micro_batch_order"]) == ("pipeline", "pipeline")
    assert (largest["settings"]["order"], largest["seqbal"]["micro_batch_order"]) == ("largest_first", "largest_first")
    pipeline_rows = [row["micro_batch_tokens"] for row in default["seqbal"]["ranks"]]
    largest_rows = [row["micro_batch_tokens"] for row in largest["seqbal"]["ranks"]]
    assert [sorted(row) for row in pipeline_rows] == [sorted(row) for row in largest_rows]
    if route == "schedule":  # slot i runs together on every rank: ordered by the slot's largest
        slot_largest = [max(slot) for slot in zip(*largest_rows)]
        assert slot_largest == sorted(slot_largest, reverse=True)
    else:
        for row in largest_rows:
            assert row == sorted(row, reverse=True)
        lengths = np.loadtxt(SAMPLE, dtype=np.int64)
        split = split_over_ranks(lengths, 2, 1, None, route)
        plans = simulate_ranks(split.lengths, 8192, micro_batch_order="pipeline")
        assert pipeline_rows == [[int(rank[p].sum()) for p in parts] for rank, parts in zip(split.lengths, plans)]
    assert pipeline_rows != largest_rows
    text = call("plan", *args, "--order", "largest_first")
    assert text.returncode == 0 and "micro-batch order=largest_first" in " ".join(text.stdout.split())
    assert "micro-batch order" not in call("plan", *args).stdout
    bad = call("plan", "--order", "smallest_first")
    assert bad.returncode == 2 and "'smallest_first'" in bad.stderr
