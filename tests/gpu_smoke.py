"""The checks that need a GPU, for a machine with one or more CUDA devices (run by gpu_smoke.sh).

CPU-only CI cannot reach the NCCL path, so this script exercises it wherever a session is lent
a GPU: ``tests/test_distributed.py``'s NCCL variants need two GPUs, and this script needs one.

1. **NCCL agreement on the device.** A one-process-per-GPU NCCL group (one rank on a one-GPU
   machine) runs ``rearrange_micro_batches`` in sync mode on a CUDA TensorDict (dense and
   jagged), ``restore_dynamic_batch``, ``loss_weights`` and an over-cap sample. Every
   all-reduce's tensor must live on the current CUDA device (the backend's device, not the CPU),
   a synced call that returns makes exactly two all-reduces, one that raises makes one and
   raises ``ValueError``.
2. **Peak memory against the cap.** A padded forward and backward of every micro-batch planned
   under ``cost_model="padded"`` at a cap of ``C`` tokens must peak no higher than one forward
   and backward of a single ``C``-token sequence (the largest thing the cap admits), plus 5%
   for allocator rounding: the cap bounds what a step allocates, which is why it is a cap.

3. **Micro-batch order and reserved memory.** The same three steps (64 samples each, padded
   micro-batches under a 4,096-token cap) run once with ``micro_batch_order="pipeline"`` and
   once with ``"largest_first"``, each from an emptied allocator cache; every step's
   micro-batches must come largest first under ``"largest_first"``, and on a GPU
   ``torch.cuda.max_memory_reserved()`` of both runs is printed: ``"largest_first"`` must
   reserve no more than ``"pipeline"`` (plus 5% for allocator rounding), since its first
   micro-batch is its largest and the caching allocator reuses those blocks for the rest.

Usage: ``torchrun --nproc_per_node=<gpus> tests/gpu_smoke.py`` or ``python tests/gpu_smoke.py``
(one rank). Prints one ``PASS``/``FAIL`` line per check and exits non-zero on a failure.
``--cpu`` is a dry run on gloo and the CPU (check 1, and check 3's order without memory
figures), so that the CPU suite runs this
script and it cannot rot between the sessions that have a GPU (tests/test_gpu_smoke.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


def _init(backend: str) -> tuple[Any, int, int]:
    import torch
    import torch.distributed as dist

    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        store = dist.TCPStore("127.0.0.1", 0, 1, True)  # port 0: a free one
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    return dist.group.WORLD, rank, world


class _AllReduceLog:
    """Wraps ``torch.distributed.all_reduce`` to record each call's tensor device."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.devices: list[str] = []
        self._original = dist.all_reduce

        def logged(tensor, *args, **kwargs):
            self.devices.append(str(tensor.device))
            return self._original(tensor, *args, **kwargs)

        dist.all_reduce = logged

    def take(self) -> list[str]:
        devices, self.devices = self.devices, []
        return devices


def _batch(rank: int, n: int, width: int, jagged: bool, device: str) -> Any:
    import torch
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(7 + rank)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    ids = torch.randint(1, 100, (n, width), generator=g) * mask
    fields = {"attention_mask": mask.to(device), "response_mask": mask.to(device).float()}
    if jagged:
        fields = {
            "input_ids": torch.nested.nested_tensor([ids[i, : lengths[i]] for i in range(n)], layout=torch.jagged),
            "response_mask": fields["response_mask"],
        }
        return TensorDict(fields, batch_size=[n]).to(device), lengths.tolist()
    fields["input_ids"] = ids.to(device)
    return TensorDict(fields, batch_size=[n], device=device), lengths.tolist()


def check_agreement(group: Any, rank: int, world: int, on_gpu: bool) -> list[str]:
    import torch

    from seqbal import loss_weights, rearrange_micro_batches, restore_dynamic_batch

    problems: list[str] = []
    log = _AllReduceLog()
    device = f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu"
    cap = 256
    for jagged in (False, True):
        batch, lengths = _batch(rank, 40 + 8 * rank, 100, jagged, device)
        micro, indices = rearrange_micro_batches(batch, cap, dp_group=group)
        calls = log.take()
        if len(calls) != 2 or set(calls) != {device}:
            problems.append(f"jagged={jagged}: all-reduces {calls}, expected two on {device}")
        if sorted(i for part in indices for i in part) != list(range(len(lengths))):
            problems.append(f"jagged={jagged}: indices {indices} are not a partition")
        if any(sum(lengths[i] for i in part) > cap for part in indices):
            problems.append(f"jagged={jagged}: a micro-batch exceeds the cap {cap}")
        counts = torch.tensor([len(micro)], device=device)
        log._original(counts, op=torch.distributed.ReduceOp.MIN, group=group)
        if counts.item() != len(micro):
            problems.append(f"jagged={jagged}: ranks disagree on the count ({len(micro)} here)")
        weights = loss_weights(micro, indices, dp_group=group)
        calls = log.take()
        if len(calls) != 1 or set(calls) != {device} or any(str(w.device) != device for w in weights):
            problems.append(f"jagged={jagged}: loss_weights all-reduces {calls}, weights on {weights[0].device}")
        if not jagged:
            outputs = [mb["input_ids"].float().sum(-1) for mb in micro]
            restored = restore_dynamic_batch(torch.cat(outputs), indices)
            if not torch.equal(restored, batch["input_ids"].float().sum(-1)):
                problems.append("restore_dynamic_batch did not give the rollout order back")
    batch, lengths = _batch(rank, 16, 60, False, device)
    if rank == world - 1:
        batch["attention_mask"][0] = 1  # a 60-token sample against a cap of 50, on one rank only
        batch["attention_mask"][1:] = 0
        batch["attention_mask"][1:, :5] = 1
    else:
        batch["attention_mask"][:] = 0
        batch["attention_mask"][:, :5] = 1
    try:
        rearrange_micro_batches(batch, 50, dp_group=group)
        problems.append("an over-cap sample did not raise")
    except ValueError as error:
        calls = log.take()
        if len(calls) != 1 or set(calls) != {device}:
            problems.append(f"the agreed error made all-reduces {calls}, expected one on {device}")
        if rank == world - 1 and "exceeds max_token_len" not in str(error):
            problems.append(f"the failing rank's message does not say why: {error}")
    return problems


def check_peak_memory(rank: int) -> list[str]:
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_model import TinyCausalLM

    from seqbal import rearrange_micro_batches

    cap = 2048
    model = TinyCausalLM(vocab=97, hidden=256, layers=2, heads=4, max_len=cap).cuda()

    def peak_of(run: Callable[[], None]) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start

    def step(ids: Any, mask: Any) -> None:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(ids, mask, positions).float().logsumexp(-1).mul(mask).sum().backward()
        model.zero_grad(set_to_none=True)

    full = torch.ones(1, cap, dtype=torch.long, device="cuda")
    step(full, full)  # warm-up: kernels and workspaces are not part of either figure
    reference = peak_of(lambda: step(full, full))
    g = torch.Generator().manual_seed(11 + rank)
    lengths = torch.randint(16, cap + 1, (96,), generator=g)
    width = int(lengths.max())
    mask = (torch.arange(width)[None] < lengths[:, None]).long().cuda()
    ids = torch.randint(1, 97, (96, width), generator=g).cuda() * mask
    from tensordict import TensorDict

    batch = TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[96], device="cuda")
    micro, _ = rearrange_micro_batches(batch, cap, cost_model="padded", trim_padding=True)
    worst = 0
    for mb in micro:
        worst = max(worst, peak_of(lambda mb=mb: step(mb["input_ids"], mb["attention_mask"])))
    print(f"rank {rank}: {len(micro)} micro-batches, worst peak {worst / 2**20:.1f} MiB, "
          f"one {cap}-token sequence {reference / 2**20:.1f} MiB")
    if worst > 1.05 * reference:
        return [f"a micro-batch peaked at {worst} bytes, over 1.05x a {cap}-token sequence's {reference}"]
    return []


def check_order_memory(rank: int, on_gpu: bool) -> list[str]:
    import torch
    from tensordict import TensorDict

    sys.path.insert(0, str(ROOT / "examples"))
    from tiny_model import TinyCausalLM

    from seqbal import rearrange_micro_batches

    device = "cuda" if on_gpu else "cpu"
    cap, hidden = (4096, 256) if on_gpu else (256, 32)
    model = TinyCausalLM(vocab=97, hidden=hidden, layers=2, heads=4, max_len=cap).to(device)

    def step(ids: Any, mask: Any) -> None:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(ids, mask, positions).float().logsumexp(-1).mul(mask).sum().backward()
        model.zero_grad(set_to_none=True)

    full = torch.ones(1, cap, dtype=torch.long, device=device)
    step(full, full)  # warm-up: kernels and workspaces belong to neither order
    g = torch.Generator().manual_seed(23 + rank)
    batches = []
    for _ in range(3):
        lengths = torch.randint(16, cap + 1, (64,), generator=g)
        width = int(lengths.max())
        mask = (torch.arange(width)[None] < lengths[:, None]).long()
        ids = torch.randint(1, 97, (64, width), generator=g) * mask
        batches.append(TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[64]).to(device))
    problems, reserved = [], {}
    for order in ("pipeline", "largest_first"):
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        for number, batch in enumerate(batches):
            micro, _ = rearrange_micro_batches(batch, cap, cost_model="padded", trim_padding=True,
                                               micro_batch_order=order)
            sizes = [mb["attention_mask"].shape[0] * mb["attention_mask"].shape[1] for mb in micro]
            if order == "largest_first" and sizes != sorted(sizes, reverse=True):
                problems.append(f"step {number}: largest_first ran micro-batches of {sizes} padded tokens")
            for mb in micro:
                step(mb["input_ids"], mb["attention_mask"])
        if on_gpu:
            torch.cuda.synchronize()
            reserved[order] = torch.cuda.max_memory_reserved()
    if on_gpu:
        print(f"rank {rank}: max_memory_reserved over 3 steps: pipeline {reserved['pipeline'] / 2**20:.1f} MiB, "
              f"largest_first {reserved['largest_first'] / 2**20:.1f} MiB "
              f"({reserved['largest_first'] / reserved['pipeline']:.3f}x)")
        if reserved["largest_first"] > 1.05 * reserved["pipeline"]:
            problems.append(f"largest_first reserved {reserved['largest_first']} bytes, over 1.05x pipeline's "
                            f"{reserved['pipeline']}")
    return problems


def main(argv: list[str]) -> int:
    import torch

    sys.path.append(str(ROOT))  # an installed seqbal comes first; else the source tree
    on_gpu = "--cpu" not in argv
    if on_gpu and not torch.cuda.is_available():
        print("FAIL no CUDA device (use --cpu for the dry run)")
        return 1
    group, rank, world = _init("nccl" if on_gpu else "gloo")
    checks: list[tuple[str, Callable[[], list[str]]]] = [
        (f"{'nccl' if on_gpu else 'gloo'} agreement", lambda: check_agreement(group, rank, world, on_gpu)),
    ]
    if on_gpu:
        checks.append(("peak memory against the cap", lambda: check_peak_memory(rank)))
    checks.append(("micro-batch order and reserved memory", lambda: check_order_memory(rank, on_gpu)))
    failed = False
    for name, check in checks:
        problems = check()
        failed |= bool(problems)
        print(f"rank {rank}/{world}: {'FAIL' if problems else 'PASS'} {name}" + "".join(f"\n  {p}" for p in problems))
    # No destroy_process_group and no interpreter teardown (see __main__): gloo's threads have
    # aborted a rank that had printed PASS ("terminate called without an active exception",
    # exit -6, torch 2.10 in CI's AReaL environment), as in the loss and distributed workers.
    return 1 if failed else 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
