"""The GPU smoke script (tests/gpu_smoke.sh, tests/gpu_smoke.py) runs on the CPU too, so that it
cannot rot between the sessions that are lent a GPU: its agreement check, dry-run on gloo with
one and two ranks under a hard deadline, must pass, and the shell wrapper must parse. Its memory
calibration step (tests/gpu_memory_smoke.py) runs here on the CPU with a small model: prediction
within 10% on held-out micro-batches and every planned micro-batch under the budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .deadline import run_with_deadline

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 180


def _run(command: list[str], deadline_s: float = DEADLINE_S) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    return run_with_deadline(command, deadline_s=deadline_s, cwd=str(ROOT), env=env, what=" ".join(command))


def test_shell_wrapper_parses():
    result = _run(["bash", "-n", "tests/gpu_smoke.sh"])
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("ranks", [1, 2])
def test_dry_run_on_gloo(ranks):
    # Through torchrun for one rank too (the env:// rendezvous the GPU script uses): a plain run's
    # FileStore group aborted at exit on torch 2.11 ("terminate called without an active exception")
    # --standalone: the rendezvous takes a free port of its own, so parallel runs never clash
    result = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                   "tests/gpu_smoke.py", "--cpu"])
    # counted, not split into lines: two ranks' prints may land on one line of the shared stdout
    passed = result.stdout.count("PASS gloo agreement")
    assert result.returncode == 0 and passed == ranks and "FAIL" not in result.stdout, result.stdout + result.stderr
    # the order check's CPU part (largest_first runs the largest micro-batch first; no memory figures)
    assert result.stdout.count("PASS micro-batch order and reserved memory") == ranks, result.stdout


def test_memory_calibration_on_the_cpu():
    # about 15 s of CPU time (two calibrations, eight metered micro-batches); a shared machine stretches it
    result = _run([sys.executable, "tests/gpu_memory_smoke.py", "--cpu"], deadline_s=420)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASS memory") == 4 and "FAIL" not in result.stdout, result.stdout
