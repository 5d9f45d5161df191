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

import pytest

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
    # the forward is padded to each micro-batch's longest: that is what the cap must bound
    largest, cap = map(int, re.search(r"largest samples x longest: (\d+) <= cap (\d+)", out).groups())
    assert largest <= cap


def _actor_reference(dump_dir: Path, mode: str) -> tuple["torch.Tensor", list]:
    """The gradient of the global loss of ``mode`` over both ranks' dumped samples in one
    forward/backward here (no micro-batches, no loss weights), and each rank's reduced gradient."""
    import importlib

    import torch
    from tensordict import TensorDict

    sys.path.insert(0, str(EXAMPLES))
    try:
        forward = importlib.import_module("ppo_actor_forward")
        tiny = importlib.import_module("tiny_model")
    finally:
        sys.path.remove(str(EXAMPLES))
    dumps = [torch.load(dump_dir / f"rank{rank}.pt") for rank in range(2)]
    batches = [TensorDict(d["batch"], batch_size=[len(d["batch"]["attention_mask"])]) for d in dumps]
    everything = torch.cat(batches)
    torch.manual_seed(0)  # the example's weights before its step
    model = tiny.TinyCausalLM(vocab=97, hidden=32, layers=2, heads=2)
    log_probs = forward.micro_batch_log_probs(model, everything)
    ratio = torch.exp(log_probs - everything["old_log_probs"])
    advantages = everything["advantages"]
    token_loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
    mask = everything["loss_mask"].float()
    per_sequence, tokens = (token_loss * mask).sum(-1), mask.sum(-1)
    if mode == "token-mean":
        loss = per_sequence.sum() / tokens.sum()
    elif mode == "seq-mean-token-mean":
        loss = (per_sequence / tokens.clamp(min=1)).sum() / len(tokens)  # no-token sequences: 0, still counted
    else:
        loss = per_sequence.sum() / len(tokens)
    loss.backward()
    reference = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return reference, [(d["gradients"][mode], d["indices"]) for d in dumps]


@pytest.mark.parametrize("short", [False, True], ids=["even", "short_rank_dummies"])
def test_ppo_actor_step_gradients_equal_the_full_batch_gradient(tmp_path, short):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(EXAMPLES / "ppo_actor_step.py"), "--dump", str(tmp_path)] + (["--short-rank"] if short else [])
    out = run(command, timeout=300).stdout
    assert "check: OK" in out
    cap = int(re.search(r"; cap (\d+) on samples x longest", out).group(1))
    headers = re.findall(r"^rank (\d): (\d+) micro-batches \((\d+) dummies\), fill \d+%, workload max/mean [\d.]+$",
                         out, flags=re.M)
    assert [h[0] for h in headers] == ["0", "1"] and headers[0][1] == headers[1][1]
    assert int(headers[0][2]) == 0 and (int(headers[1][2]) > 0) == short
    for title in ("samples x longest", "share of the loss", "fill", "workload max/mean", "dummy", "verl <= 0.8"):
        assert re.search(rf"^  {re.escape(title)}\s{{2,}}\S", out, flags=re.M), title  # the legend explains it
    rows = re.findall(r"^\s+\d+\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)%\s+(real|dummy)$", out, flags=re.M)
    assert len(rows) == 2 * int(headers[0][1])
    for samples, padded, tokens, share, kind in rows:
        assert int(padded) <= cap  # the padded forward holds samples x longest: the cap bounds it
        # a dummy holds none of the batch's samples and carries none of the loss
        assert kind == "real" and int(samples) > 0 or (samples == "0" and tokens == "0" and float(share) == 0.0)
    # the share of the loss is a share: 100% over every rank's micro-batches (rows rounded to 0.1%)
    assert abs(sum(float(row[3]) for row in rows) - 100.0) <= 0.05 * len(rows) + 1e-9
    naive = re.findall(r"^  verl <= 0\.8 on this batch: (.*)$", out, flags=re.M)
    assert len(naive) == 2
    for line in naive:
        found = re.fullmatch(rf"(\d+) micro-batches, largest (\d+) against the cap {cap} \((\d+|none) over it\)", line)
        assert found or (short and line.startswith("fails, the ranks' count")), line
        if found:
            assert (found.group(3) == "none") == (int(found.group(2)) <= cap)
    assert short or any("over it" in line and "none" not in line for line in naive)  # the cap it breaks
    before, after = map(float, re.search(r"loss (-?[\d.]+) -> (-?[\d.]+)", out).groups())
    assert after < before
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        reference, ranks = _actor_reference(tmp_path, mode)
        for gradient, indices in ranks:
            error = float((gradient - reference).abs().max())
            assert error <= 1e-6 + 1e-4 * float(reference.abs().max()), (mode, error)
        assert any(part == [] for part in ranks[1][1]) == short


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
