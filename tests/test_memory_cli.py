"""``seqbal plan --memory-budget BYTES --calibration FILE``: the cap comes from the calibration,
for the file's lengths, and the output says which and why."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from seqbal.cli import main
from seqbal.memory import Calibration, MemoryModel

MODEL = MemoryModel(fixed=2e9, per_sequence=3e4, per_token=4e5, per_token_squared=150.0, per_longest_squared=40.0)
BUDGET = 40 << 30


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def files(tmp_path):
    calibration = tmp_path / "cal.json"
    Calibration(MODEL, 8 << 30, margin=0.1).save(calibration)  # saved under another budget: rebudgeted
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(s) for s in [120, 3000, 800, 64, 2500, 900] * 20) + "\n")
    return str(calibration), str(lengths)


def test_the_cap_is_the_calibrations_for_the_files_lengths(files):
    calibration, lengths = files
    code, out, err = _run(["plan", lengths, "--memory-budget", str(BUDGET), "--calibration", calibration,
                           "--compare", "off"])
    expected = Calibration(MODEL, BUDGET, margin=0.1, length_range=(64, 3000))
    assert code == 0, err
    assert out.startswith(f"memory: max_token_len {expected.max_token_len}: the worst micro-batch")
    flat = " ".join(out.split())  # the report wraps at 80 columns
    assert "(lengths 64..3000)" in flat and f"settings: max_token_len={expected.max_token_len}" in flat
    code, out, _ = _run(["plan", lengths, "--memory-budget", str(BUDGET), "--calibration", calibration,
                         "--compare", "off", "--json"])
    report = json.loads(out)
    assert report["memory"]["max_token_len"] == expected.max_token_len == report["settings"]["max_token_len"]
    assert report["seqbal"]["ranks"][0]["largest_micro_batch"] <= expected.max_token_len


@pytest.mark.parametrize("argv, message", [
    (["--memory-budget", "1000000"], "--memory-budget and --calibration go together"),
    (["--memory-budget", "1000", "--calibration", "CAL"], "not even one sequence of 64 tokens"),
    (["--memory-budget", "1000000", "--calibration", "MISSING"], "cannot read calibration"),
])
def test_usage_errors_exit_2_with_one_line(files, argv, message):
    calibration, lengths = files
    argv = [calibration if a == "CAL" else a for a in argv]
    code, _, err = _run(["plan", lengths, "--compare", "off", *argv])
    assert code == 2 and message in err and err.startswith("seqbal: error:") and err.count("\n") == 1
