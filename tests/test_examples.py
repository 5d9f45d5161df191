"""Run every example as a user would, so that they cannot rot.

The examples check their own results (micro-batched log-probs and accumulated gradients against
one full-batch pass) and exit non-zero when the check fails; here we also read their tables.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def test_ppo_actor_forward_two_ranks():
    # --standalone picks a free rendezvous port, so parallel test runs do not collide.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(EXAMPLES / "ppo_actor_forward.py")]
    out = run(command, timeout=240).stdout
    assert "check: OK" in out
    assert re.search(r"^backend: (gloo|nccl) \(2 rank\(s\)", out, flags=re.M)
    assert "same micro-batch count on every rank: True" in out
    headers = re.findall(r"^rank (\d): (\d+) micro-batches \((\d+) if it planned alone\)", out, flags=re.M)
    assert [h[0] for h in headers] == ["0", "1"]
    counts = {int(h[1]) for h in headers}
    assert len(counts) == 1 and counts.pop() >= 2, "the cap must force several micro-batches, equal on both ranks"
    assert all(int(h[1]) >= int(h[2]) for h in headers)
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)%$", out, flags=re.M)
    assert len(rows) == sum(int(h[1]) for h in headers)
    for _, samples, tokens, padded, cap, _share in rows:
        # the forward is padded: samples x longest is what it holds, and what the cap bounds
        assert int(samples) >= 1 and int(tokens) <= int(padded) <= int(cap)


def test_sft_step():
    out = run([sys.executable, str(EXAMPLES / "sft_step.py")], timeout=180).stdout
    assert "check: OK" in out
    count = int(re.search(r"(\d+) micro-batches on rank 0", out).group(1))
    assert count >= 2
    before, after = map(float, re.search(r"batch loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert after < before


def test_ppo_example_uses_nccl_only_with_a_gpu_per_rank(monkeypatch):
    """On a one-GPU machine two ranks must not pick NCCL (and call set_device(1))."""
    import importlib

    import torch

    monkeypatch.syspath_prepend(str(EXAMPLES))
    example = importlib.import_module("ppo_actor_forward")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for gpus, ranks, expected in [(1, 2, "gloo"), (2, 2, "nccl"), (8, 2, "nccl"), (4, 8, "gloo")]:
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        assert example.choose_backend(ranks) == expected, (gpus, ranks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert example.choose_backend(1) == "gloo"
