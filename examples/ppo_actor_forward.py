"""PPO actor forward with seqbal: per-token log-probs of rollout responses in dynamic micro-batches.

Run:  torchrun --nproc_per_node=2 examples/ppo_actor_forward.py
      (NCCL when this node has a GPU for every rank, else gloo on the CPU;
      `python examples/ppo_actor_forward.py` runs 1 rank)

What a PPO/GRPO actor does when it recomputes old log-probs, step by step:
  1. each data-parallel rank holds a rollout batch: left-padded prompts, right-padded responses;
  2. ``rearrange_micro_batches`` splits it under a hard cap; with ``dp_group`` every rank
     runs the same number of micro-batches (two all-reduces, whatever the data);
  3. each micro-batch is un-padded to its own longest sequence (this is where the saving is:
     a micro-batch of short samples no longer carries the padding of the batch's longest).
     The forward is then a padded one: it holds ``samples x longest`` tokens, so the plan uses
     ``cost_model="padded"`` and the cap bounds exactly that (the default token cost would let
     a micro-batch mix one long and many short samples, several times over the cap once
     padded; a remove-padding forward keeps the default);
  4. the per-sample log-probs are concatenated and put back in rollout order with
     ``restore_dynamic_batch``;
  5. the result is checked against one forward of the whole padded batch.

Tolerance: float32 on CPU, |micro-batched - full| <= 1e-5 + 1e-5 * |full| on every response
token (the two paths differ only in matmul shapes, hence summation order). The script exits
with code 1 on every rank if any rank fails the check.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from tensordict import TensorDict

from seqbal import calculate_workload, plan_micro_batches, rearrange_micro_batches, restore_dynamic_batch
from tiny_model import TinyCausalLM

ATOL = RTOL = 1e-5


def choose_backend(local_world_size: int) -> str:
    """NCCL only when every rank of this node can have a GPU of its own, else gloo on the CPU.

    Two ranks on a one-GPU machine would both need ``cuda:0`` (NCCL refuses two ranks on one
    device) or ``set_device(1)``, which does not exist there; gloo on the CPU always works.
    """
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
    return "gloo"


def init_distributed() -> tuple[torch.device, str]:
    """torchrun sets RANK/WORLD_SIZE; a plain `python` run gets a one-rank group of its own."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    backend = choose_backend(local_world)
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), backend
    return torch.device("cpu"), backend


def rollout_batch(rank: int, batch_size: int, max_prompt: int, max_response: int, vocab: int, device) -> TensorDict:
    """A rollout batch as RL trainers hold it: ``[pad..pad prompt | response pad..pad]``."""
    g = torch.Generator().manual_seed(1000 + rank)
    prompt_lens = torch.randint(2, max_prompt + 1, (batch_size,), generator=g)
    response_lens = torch.randint(1, max_response + 1, (batch_size,), generator=g)
    positions_p = torch.arange(max_prompt)
    positions_r = torch.arange(max_response)
    prompt_mask = positions_p[None] >= (max_prompt - prompt_lens)[:, None]  # left padding
    response_mask = positions_r[None] < response_lens[:, None]  # right padding
    prompts = torch.randint(1, vocab, (batch_size, max_prompt), generator=g) * prompt_mask
    responses = torch.randint(1, vocab, (batch_size, max_response), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    return TensorDict(
        {
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": response_mask.long(),
            "prompt_lengths": prompt_lens,
        },
        batch_size=[batch_size],
        device=device,
    )


def full_batch_log_probs(model: TinyCausalLM, batch: TensorDict) -> torch.Tensor:
    """Reference: one forward of the whole padded batch. Response token j sits at P + j and is
    predicted by the logits at P + j - 1 (P = padded prompt width)."""
    logits = model(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    width = batch["responses"].shape[1]
    prompt_width = batch["input_ids"].shape[1] - width
    predicting = logits[:, prompt_width - 1 : prompt_width - 1 + width].log_softmax(-1)
    log_probs = predicting.gather(-1, batch["responses"][..., None]).squeeze(-1)
    return log_probs * batch["response_mask"]


def micro_batch_log_probs(model: TinyCausalLM, micro_batch: TensorDict) -> torch.Tensor:
    """Un-pad one micro-batch to its own longest sequence, forward, and return ``[b, R]`` log-probs."""
    mask = micro_batch["attention_mask"]
    lengths = mask.sum(-1)
    longest = int(lengths.max())
    prompt_width = mask.shape[1] - micro_batch["responses"].shape[1]
    prompt_lengths = micro_batch["prompt_lengths"]
    # Real tokens are contiguous from the first prompt token: shift each row left to start at 0.
    start = prompt_width - prompt_lengths
    columns = (start[:, None] + torch.arange(longest, device=mask.device)[None]).clamp(max=mask.shape[1] - 1)
    keep = torch.arange(longest, device=mask.device)[None] < lengths[:, None]
    input_ids = micro_batch["input_ids"].gather(1, columns) * keep
    positions = torch.arange(longest, device=mask.device).expand_as(input_ids)
    logits = model(input_ids, keep.long(), positions)
    # Response token j of sample i is at prompt_lengths[i] + j, predicted by the position before it.
    width = micro_batch["responses"].shape[1]
    predictor = (prompt_lengths[:, None] - 1 + torch.arange(width, device=mask.device)[None]).clamp(max=longest - 1)
    predicting = logits.gather(1, predictor[..., None].expand(-1, -1, logits.shape[-1])).log_softmax(-1)
    log_probs = predicting.gather(-1, micro_batch["responses"][..., None]).squeeze(-1)
    return log_probs * micro_batch["response_mask"]


def format_table(rank: int, micro_batches: list[TensorDict], cap: int, own_count: int, max_abs_error: float) -> str:
    """Per micro-batch: real tokens, and ``samples x longest``, what the padded forward holds
    (the cost the cap bounds), with the share of the rank's padded workload."""
    lengths = [mb["attention_mask"].sum(-1).cpu() for mb in micro_batches]
    padded = [len(l) * int(l.max()) for l in lengths]
    workloads = [len(l) * int(calculate_workload(l.max())) for l in lengths]
    total_work = sum(workloads)
    lines = [
        f"rank {rank}: {len(micro_batches)} micro-batches ({own_count} if it planned alone), "
        f"max |error| vs full batch = {max_abs_error:.2e}",
        f"{'micro-batch':>11}  {'samples':>7}  {'tokens':>6}  {'samples x longest':>17}  {'cap':>4}  {'workload share':>14}",
    ]
    for i, (l, area, work) in enumerate(zip(lengths, padded, workloads)):
        lines.append(f"{i:>11}  {len(l):>7}  {int(l.sum()):>6}  {area:>17}  {cap:>4}  {work / total_work:>14.1%}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank (default 16)")
    parser.add_argument("--max-token-len", type=int, default=64,
                        help="hard cap on samples x longest per micro-batch (default 64)")
    args = parser.parse_args()

    device, backend = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical weights on every rank, as after a broadcast
    model = TinyCausalLM(vocab=97, hidden=32, layers=2, heads=2).to(device).eval()
    batch = rollout_batch(rank, args.batch_size, max_prompt=12, max_response=20, vocab=97, device=device)

    with torch.no_grad():
        micro_batches, indices = rearrange_micro_batches(
            batch, max_token_len=args.max_token_len, dp_group=dist.group.WORLD, cost_model="padded"
        )
        outputs = [micro_batch_log_probs(model, mb) for mb in micro_batches]
        log_probs = restore_dynamic_batch(torch.cat(outputs), indices)
        reference = full_batch_log_probs(model, batch)

    error = (log_probs - reference).abs()
    ok = bool((error <= ATOL + RTOL * reference.abs()).all())
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)

    # What this rank would do without the agreement (no dp_group: no collective, own count).
    own_count = len(plan_micro_batches(batch["attention_mask"].sum(-1), args.max_token_len, cost_model="padded"))
    table = format_table(rank, micro_batches, args.max_token_len, own_count, float(error.max()))
    tables = [None] * world
    dist.all_gather_object(tables, table)
    if rank == 0:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        print(f"backend: {backend} ({world} rank(s), {gpus} GPU(s): NCCL needs a GPU per rank on each node)\n")
        print("\n\n".join(tables))
        counts = {t.split(": ")[1].split(" ")[0] for t in tables}
        print(f"\nsame micro-batch count on every rank: {len(counts) == 1}")
        print("check: " + ("OK, micro-batched log-probs equal the full-batch forward" if flag.item() else "FAILED")
              + f" (atol={ATOL}, rtol={RTOL})")
    dist.destroy_process_group()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
