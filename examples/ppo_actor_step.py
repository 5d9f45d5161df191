"""One PPO actor update on dynamic micro-batches: forward, clipped loss, backward, DDP, step.

Run:  torchrun --nproc_per_node=2 examples/ppo_actor_step.py
      torchrun --nproc_per_node=2 examples/ppo_actor_step.py --short-rank   (rank 1 holds 2 samples)
      (NCCL when this node has a GPU for every rank, else gloo on the CPU;
      `python examples/ppo_actor_step.py` runs 1 rank)

What a PPO/GRPO actor does in one update, per data-parallel rank:
  1. it holds a rollout batch (left-padded prompts, right-padded responses) with the old
     log-probs of the policy that sampled it and an advantage per response; responses cut at
     the length limit are masked out of the loss (DAPO's overlong filter), so some sequences
     have no loss token at all;
  2. ``rearrange_micro_batches`` splits it under a hard cap on ``samples x longest`` (the
     forward is padded to each micro-batch's longest, see ``cost_model="padded"``) with the
     same count on every rank; with ``--short-rank`` rank 1 has fewer samples than that count
     and gets dummy micro-batches (``dummy_micro_batches=True``) instead of an error;
  3. ``loss_weights`` turns the global counts of loss tokens and sequences (one all-reduce)
     into a weight per sample, so that the summed, weighted token losses of every micro-batch
     of every rank give exactly the gradient of the step's loss, whatever the split;
  4. per micro-batch: forward, the PPO clipped surrogate per token, ``(loss * mask * w).sum()``,
     backward; DDP averages the gradients over the ranks at the last micro-batch (``no_sync``
     before it);
  5. the reduced gradient is checked against the gradient of the same global loss computed in
     one pass over every rank's samples (no micro-batches, no weights: the formulas of the three
     modes written out), for three of verl's ``loss_agg_mode`` names (tests/test_loss.py checks
     all five against verl's own ``agg_loss``); then one AdamW step.

Tolerance: float32, |accumulated - full| <= 1e-6 + 1e-4 * max|full| per mode. ``--dump DIR``
writes each rank's batch and reduced gradients (for the test's own reference). Exit code 1 on
every rank if any check fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ppo_actor_forward import init_distributed, micro_batch_log_probs, rollout_batch
from seqbal import (calculate_workload, ceildiv, get_seqlen_balanced_partitions, loss_weights, micro_batch_metrics,
                    rearrange_micro_batches, restore_dynamic_batch)
from tiny_model import TinyCausalLM

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
CLIP = 0.2
ATOL, RTOL = 1e-6, 1e-4
MAX_PROMPT, MAX_RESPONSE, VOCAB = 12, 20, 97


def actor_batch(rank: int, batch_size: int, device: torch.device):
    """A rollout batch plus what the update needs: advantages, old log-probs, a loss mask."""
    batch = rollout_batch(rank, batch_size, MAX_PROMPT, MAX_RESPONSE, VOCAB, device)
    g = torch.Generator().manual_seed(3000 + rank)
    response_mask = batch["response_mask"]
    truncated = response_mask.sum(-1) >= MAX_RESPONSE - 1  # hit the length limit: no loss (overlong filter)
    batch["loss_mask"] = response_mask * (~truncated).long()[:, None]
    batch["advantages"] = torch.randn(batch_size, generator=g).to(device)[:, None] * response_mask
    # the sampler's log-probs differ from the trainer's (another engine, an older policy): a drift
    # on top of the recomputed old log-probs keeps the clip active in this one-step example
    batch["drift"] = (0.3 * torch.randn(batch_size, MAX_RESPONSE, generator=g)).to(device) * response_mask
    return batch


def ppo_token_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """PPO's clipped surrogate per token, ``[b, R]`` (to be masked and weighted)."""
    ratio = torch.exp(log_probs - old_log_probs)
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - CLIP, 1 + CLIP))


def global_loss(token_loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The step's loss over every sample at once, from the definitions (the reference)."""
    mask = mask.to(token_loss.dtype)
    per_sequence = (token_loss * mask).sum(-1)
    tokens = mask.sum(-1)
    if mode == "token-mean":
        return per_sequence.sum() / tokens.sum()
    if mode == "seq-mean-token-mean":  # a sequence without loss tokens adds 0 and still counts
        return torch.where(tokens > 0, per_sequence / tokens.clamp(min=1), torch.zeros_like(tokens)).sum() / len(tokens)
    return per_sequence.sum() / len(tokens)


def flat_gradient(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).detach().clone()


def weighted_loss(model: torch.nn.Module, micro_batch, weight: torch.Tensor) -> torch.Tensor:
    """This micro-batch's share of the step's loss: ``(token_loss * loss_mask * w).sum()``."""
    log_probs = micro_batch_log_probs(model, micro_batch)
    token_loss = ppo_token_loss(log_probs, micro_batch["old_log_probs"], micro_batch["advantages"])
    return (token_loss * micro_batch["loss_mask"] * weight[:, None]).sum()


def accumulate(ddp: DistributedDataParallel, micro_batches, indices, mode: str, group) -> tuple[torch.Tensor, float]:
    """Backward every micro-batch's weighted loss; DDP averages at the last one. Returns the
    reduced gradient and the step's loss (summed over the ranks' weighted losses)."""
    weights = loss_weights(micro_batches, indices, loss_mask_key="loss_mask", mode=mode, dp_group=group)
    ddp.zero_grad()
    total = torch.zeros((), device=weights[0].device)
    for position, (micro_batch, weight) in enumerate(zip(micro_batches, weights)):
        last = position == len(micro_batches) - 1
        with ddp.no_sync() if not last else torch.enable_grad():
            loss = weighted_loss(ddp, micro_batch, weight)
            loss.backward()
        total += loss.detach()
    dist.all_reduce(total, group=group)  # each rank's share is scaled by W for DDP's averaging
    return flat_gradient(ddp.module), float(total) / dist.get_world_size(group)


def reference_gradient(model: TinyCausalLM, everything, mode: str) -> torch.Tensor:
    """One forward/backward of the global loss over every rank's samples, no micro-batching."""
    model.zero_grad()
    log_probs = micro_batch_log_probs(model, everything)  # un-padded to the longest of all samples
    token_loss = ppo_token_loss(log_probs, everything["old_log_probs"], everything["advantages"])
    global_loss(token_loss, everything["loss_mask"], mode).backward()
    return flat_gradient(model)


def naive_one_pass(lengths: list[int], cap: int, group) -> str:
    """What verl <= 0.8 would have done with this rank's batch: the count ``ceildiv(tokens, cap)``
    (capped at the samples, the ranks' MAX in one all-reduce), one Karmarkar-Karp pass on the
    workloads at that count (seqbal's verl-compatible ``get_seqlen_balanced_partitions``), and
    no check of the cap. Shown as the count and the largest ``samples x longest`` (what this
    padded forward allocates) against the cap."""
    count = torch.tensor([min(len(lengths), ceildiv(sum(lengths), cap))])
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)  # a CPU tensor: gloo; the line is for show
    count = int(count)
    if count > len(lengths):  # verl asserts here, on this rank alone, while the others wait
        return f"verl <= 0.8 on this batch: fails, the ranks' count {count} is more than its {len(lengths)} samples"
    parts = get_seqlen_balanced_partitions(calculate_workload(lengths).tolist(), count, equal_size=False)
    padded = [len(part) * max(lengths[i] for i in part) for part in parts]
    over = sum(cost > cap for cost in padded)
    return (f"verl <= 0.8 on this batch: {count} micro-batches, largest {max(padded)} against the cap {cap}"
            + (f" ({over} over it)" if over else " (none over it)"))


def format_table(rank: int, micro_batches, indices, weights, metrics: dict, loss_total: float, naive: str) -> str:
    """This rank's micro-batches: samples, ``samples x longest`` against the cap, loss tokens and
    share of the step's loss (its ``sum(w x loss tokens)`` over that sum on every rank); a dummy
    holds none of the batch's samples (one copied row, weight 0)."""
    lines = [
        f"rank {rank}: {len(micro_batches)} micro-batches ({metrics['seqbal/dummies']} dummies), "
        f"fill {metrics['seqbal/fill']:.0%}, workload max/mean {metrics['seqbal/workload_imbalance']:.2f}",
        f"  {'micro-batch':>11}  {'samples':>7}  {'samples x longest':>17}  {'loss tokens':>11}  "
        f"{'share of the loss':>17}  kind",
    ]
    for i, (mb, part, w) in enumerate(zip(micro_batches, indices, weights)):
        lengths = mb["attention_mask"].sum(-1)
        area = len(lengths) * int(lengths.max())
        tokens = mb["loss_mask"].sum(-1)
        share = float((w * tokens).sum()) / loss_total if loss_total else 0.0
        lines.append(
            f"  {i:>11}  {len(part):>7}  {area:>17}  {int(tokens.sum()) if part else 0:>11}  "
            f"{share:>16.1%}  {'real' if part else 'dummy'}"
        )
    lines.append(f"  {naive}")
    return "\n".join(lines)


LEGEND = """\
How to read the tables (one per rank):
  samples x longest  what the padded forward allocates; seqbal keeps it under the cap
  loss tokens        the micro-batch's tokens in the loss mask
  share of the loss  its sum(w x loss tokens) over that sum on every rank, w being
                     loss_weights' weight per sample: the part of the step's loss it
                     carries, 100% over all ranks (token-mean: its share of loss tokens)
  fill               the rank's tokens over micro-batches x cap
  workload max/mean  the heaviest micro-batch's compute over the mean (1.00 is even)
  dummy              0 samples of the batch: one copied row with weight 0, so that a
                     short rank runs the agreed count
  verl <= 0.8        what its one Karmarkar-Karp pass at ceildiv(tokens, cap), with no
                     check of the cap, would run on the same batch: the count, and the
                     largest samples x longest against the cap"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank (default 16)")
    parser.add_argument("--max-token-len", type=int, default=64,
                        help="hard cap on samples x longest per micro-batch (default 64)")
    parser.add_argument("--short-rank", action="store_true", help="rank 1 holds 2 samples (it gets dummies)")
    parser.add_argument("--mode", choices=MODES, default="token-mean", help="the mode of the optimizer step")
    parser.add_argument("--dump", help="directory for each rank's batch and gradients (rank<r>.pt)")
    args = parser.parse_args()

    device, backend = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    torch.manual_seed(0)  # identical weights on every rank, as after a broadcast
    model = TinyCausalLM(vocab=VOCAB, hidden=32, layers=2, heads=2).to(device)
    reference_model = TinyCausalLM(vocab=VOCAB, hidden=32, layers=2, heads=2).to(device)
    reference_model.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    batch_size = 2 if args.short_rank and rank == 1 else args.batch_size
    batch = actor_batch(rank, batch_size, device)

    # 1-2. The plan: synced count, padded cost, dummies for a short rank. First the old
    #      log-probs (a forward without grad, put back in rollout order, dummies dropped) ...
    plan = dict(max_token_len=args.max_token_len, dp_group=group, cost_model="padded", dummy_micro_batches=True)
    micro_batches, indices = rearrange_micro_batches(batch, **plan)
    with torch.no_grad():
        recomputed = restore_dynamic_batch([micro_batch_log_probs(model, mb) for mb in micro_batches], indices)
    batch["old_log_probs"] = (recomputed + batch["drift"]) * batch["response_mask"]
    # ... then the update's micro-batches, which carry them (the same plan: it is deterministic).
    micro_batches, indices = rearrange_micro_batches(batch, **plan)
    lengths = batch["attention_mask"].sum(-1).tolist()
    metrics = micro_batch_metrics(lengths, indices, args.max_token_len, cost_model="padded")

    # 3-4. One accumulated, reduced gradient per mode (the step itself uses --mode).
    gradients, losses = {}, {}
    for mode in MODES:
        gradients[mode], losses[mode] = accumulate(ddp, micro_batches, indices, mode, group)

    # 5. The reference on every rank's samples at once (gathered), one pass, per mode.
    gathered = [None] * world
    dist.all_gather_object(gathered, batch.cpu())
    everything = torch.cat(gathered).to(device)
    errors = {}
    for mode in MODES:
        reference = reference_gradient(reference_model, everything, mode)
        difference = (gradients[mode] - reference).abs()
        errors[mode] = (float(difference.max()), bool((difference <= ATOL + RTOL * reference.abs().max()).all()))
    flag = torch.tensor([int(all(ok for _, ok in errors.values()))], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        torch.save({"batch": batch.cpu().to_dict(), "indices": indices,
                    "gradients": {m: g.cpu() for m, g in gradients.items()}},
                   os.path.join(args.dump, f"rank{rank}.pt"))

    # The optimizer step on the --mode gradient (DDP left it in .grad of every rank alike).
    offset = 0
    for parameter in model.parameters():
        parameter.grad.copy_(gradients[args.mode][offset : offset + parameter.numel()].view_as(parameter))
        offset += parameter.numel()
    optimizer.step()
    weights = loss_weights(micro_batches, indices, loss_mask_key="loss_mask", mode=args.mode, dp_group=group)
    with torch.no_grad():
        after = sum(weighted_loss(model, mb, w) for mb, w in zip(micro_batches, weights))
    after_total = after.reshape(1)
    dist.all_reduce(after_total)

    # the share of the loss: each micro-batch's sum(w x loss tokens) over that sum on every rank
    carried = torch.tensor([sum(float((w * mb["loss_mask"].sum(-1)).sum()) for mb, w in zip(micro_batches, weights))],
                           dtype=torch.float64, device=device)
    dist.all_reduce(carried, group=group)
    naive = naive_one_pass(lengths, args.max_token_len, group)
    table = format_table(rank, micro_batches, indices, weights, metrics, float(carried), naive)
    tables = [None] * world
    dist.all_gather_object(tables, table)
    if rank == 0:
        print(f"backend: {backend} ({world} rank(s)); samples per rank: "
              f"{[len(b) for b in gathered]}; cap {args.max_token_len} on samples x longest\n")
        print(LEGEND + "\n")
        print("\n\n".join(tables))
        print(f"\n{'mode':<20}  {'loss':>10}  {'max |grad - full-batch grad|':>28}  check")
        for mode in MODES:
            error, ok = errors[mode]
            print(f"{mode:<20}  {losses[mode]:>10.6f}  {error:>28.2e}  {'OK' if ok else 'FAILED'}")
        print(f"\none AdamW step on {args.mode}: loss {losses[args.mode]:.6f} -> {float(after_total) / world:.6f}")
        print("check: " + ("OK, accumulated gradients equal the full-batch gradients" if flag.item() else "FAILED")
              + f" (atol={ATOL}, rtol={RTOL} of the largest entry)")
    dist.destroy_process_group()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
