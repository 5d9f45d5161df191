"""`seqbal plan` driven as a user drives it: a subprocess, its output and its exit code."""

from __future__ import annotations

import contextlib
import io
import json
import os
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
    """In-process ``main(argv)``: same code path as the subprocess, without the ~3 s of importing
    torch again. Used for the many input variants; the subprocess tests cover the real launch."""
    from seqbal.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse
            code = exit_.code
    return Result(code, stdout.getvalue(), stderr.getvalue())


def assert_clean_failure(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def plan_json(*args: str) -> dict:
    result = call("plan", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def rank_parts(lengths: np.ndarray, tokens_per_micro_batch: list[int]) -> None:
    """Cheap cross-check: the reported micro-batch tokens add up to the rank's tokens."""
    assert sum(tokens_per_micro_batch) == int(lengths.sum())


def test_default_sample_prints_both_tables():
    result = run("plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "qwen25math_cot_rollouts.txt (shipped sample): 800 samples, 383611 tokens" in out
    assert "seqbal: 94 micro-batches per rank" in out
    assert "older KK loop:" in out
    for title in ("samples", "tokens", "lower bound", "micro-batches", "fill %", "workload max/mean", "largest micro-batch"):
        assert out.count(title) >= 2, title


def test_json_matches_library_and_agreement_rule():
    from seqbal import plan_micro_batches

    report = plan_json("--dp", "4", "--max-token-len", "8192", "--divisible-by", "2")
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
    old = report["kk_loop"]
    assert old["kk_passes"] >= 1 and old["micro_batches_per_rank"] % 2 == 0
    assert all(r["largest_micro_batch"] <= 8192 for r in old["ranks"])


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
                       "--min-micro-batches", "7", "--max-token-len", "16384")
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
        ("binary.txt", b"\xff\xfe\x00\x01", [], ["binary.txt", "not a text file"]),
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
        (["--max-token-len", "2000"], ["exceeds max_token_len=2000", "sample 201 has 2879 tokens"]),
        (["--max-token-len", "0"], ["max_token_len must be a positive int, got 0"]),
        (["--group-size", "8"], ["forced group exceeds max_token_len"]),
        (["--group-size", "7"], ["--group-size 7 does not divide the number of samples 800"]),
        (["--group-size", "0"], ["force_group_size must be an int >= 1, got 0"]),
        (["--divisible-by", "0"], ["num_batches_divided_by must be None or an int >= 1, got 0"]),
        (["--min-micro-batches", "801"], ["Cannot satisfy max_token_len=4096"]),
        (["--dp", "8", "--min-micro-batches", "101"], ["rank 7: Cannot satisfy max_token_len=4096"]),
        (["--dp", "0"], ["--dp must be >= 1, got 0"]),
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
    assert_clean_failure(call("plan", "--max-token-len", "lots"), "invalid int value")
    assert_clean_failure(call(), "plan")


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


def test_report_when_the_older_loop_fails(tmp_path):
    from seqbal.cli import format_report

    path = tmp_path / "lengths.txt"
    path.write_text("5\n7\n3\n")
    report = plan_json(str(path), "--max-token-len", "8")
    report["kk_loop"].update(ranks=[], micro_batches_per_rank=None, failed_at=4, kk_passes=2)
    text = format_report(report)
    assert "seqbal: 2 micro-batches per rank" in text
    assert "older KK loop: failed, it reached 4 micro-batches" in text
