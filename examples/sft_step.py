"""One SFT optimizer step with gradient accumulation over seqbal's dynamic micro-batches.

Run:  python examples/sft_step.py                                  (one process)
      torchrun --nproc_per_node=2 examples/sft_step.py             (two data-parallel ranks)

The point is the loss normalisation. Dynamic micro-batches hold different numbers of loss
tokens, so averaging the loss per micro-batch and then over micro-batches weights a token of
a small micro-batch more than a token of a big one: the accumulated gradient is then *not* the
gradient of the batch loss. The right way is to divide every micro-batch's summed token loss by
the number of loss tokens of the whole global batch (all micro-batches, all ranks), and sum the
gradients (backward accumulates; ranks all-reduce with SUM). ``seqbal.loss_weights`` computes
that scale for you (and the sequence-level modes); ``examples/ppo_actor_step.py`` uses it.

The forward is padded: each micro-batch is cut to its own longest sample, so it holds
``samples x longest`` tokens. The plan therefore uses ``cost_model="padded"``, which caps
exactly that (the default token cost caps real tokens only, and a micro-batch mixing one long
and several short samples would hold more than the cap once padded).

The script checks that the accumulated gradient equals the gradient of one forward/backward
over the whole global batch, within |acc - full| <= 1e-6 + 1e-4 * |full| (float32; the paths
differ only in summation order), prints how far off the per-micro-batch mean would have been,
and takes one AdamW step. Exit code 1 if the check fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensordict import TensorDict

from seqbal import rearrange_micro_batches
from tiny_model import TinyCausalLM

ATOL, RTOL = 1e-6, 1e-4


def sft_batch(rank: int, batch_size: int, width: int, vocab: int) -> TensorDict:
    """Right-padded ``prompt + response`` sequences; the loss is on response tokens only."""
    g = torch.Generator().manual_seed(2000 + rank)
    prompt_lens = torch.randint(2, 11, (batch_size,), generator=g)
    response_lens = torch.randint(1, width - 10 + 1, (batch_size,), generator=g)
    positions = torch.arange(width)[None]
    attention_mask = (positions < (prompt_lens + response_lens)[:, None]).long()
    loss_mask = ((positions >= prompt_lens[:, None]) & attention_mask.bool()).long()
    input_ids = torch.randint(1, vocab, (batch_size, width), generator=g) * attention_mask
    return TensorDict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask},
        batch_size=[batch_size],
    )


def summed_token_loss(model: TinyCausalLM, batch: TensorDict) -> torch.Tensor:
    """Sum of the next-token NLL over loss tokens. Right padding: trim to the longest sample."""
    longest = int(batch["attention_mask"].sum(-1).max())
    input_ids = batch["input_ids"][:, :longest]
    mask = batch["attention_mask"][:, :longest]
    positions = torch.arange(longest).expand_as(input_ids)
    logits = model(input_ids, mask, positions)
    # token t is predicted by the logits at t - 1
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")
    return (nll * batch["loss_mask"][:, 1:longest]).sum()


def gradients(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def accumulate(model: TinyCausalLM, micro_batches, divisor, distributed: bool) -> torch.Tensor:
    """Backward every micro-batch's summed token loss divided by ``divisor(micro_batch)``;
    gradients add up in ``.grad`` (and over ranks with a SUM all-reduce). Returns them flat."""
    model.zero_grad()
    for micro_batch in micro_batches:
        (summed_token_loss(model, micro_batch) / divisor(micro_batch)).backward()
    if distributed:
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)  # SUM: each rank already divided by the global count
    return gradients(model).clone()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank (default 16)")
    parser.add_argument("--max-token-len", type=int, default=64, help="hard cap per micro-batch (default 64)")
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    group = dist.group.WORLD if distributed else None

    torch.manual_seed(0)  # identical weights on every rank
    model = TinyCausalLM(vocab=97, hidden=32, layers=2, heads=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = sft_batch(rank, args.batch_size, width=32, vocab=97)

    # 1. The global number of loss tokens: this rank's, summed over the data-parallel ranks.
    #    (loss_mask[:, 0] can never be a target, so count targets from position 1.)
    global_tokens = batch["loss_mask"][:, 1:].sum()
    if distributed:
        dist.all_reduce(global_tokens)

    # 2. Gradient accumulation over dynamic micro-batches, each loss divided by the global count.
    micro_batches, _ = rearrange_micro_batches(
        batch, max_token_len=args.max_token_len, dp_group=group, cost_model="padded"
    )
    largest = max(len(mb) * int(mb["attention_mask"].sum(-1).max()) for mb in micro_batches)
    accumulated = accumulate(model, micro_batches, lambda mb: global_tokens, distributed)

    # 3. Reference: one forward/backward of the whole global batch (every rank rebuilds all of it).
    model.zero_grad()
    everything = torch.cat([sft_batch(r, args.batch_size, width=32, vocab=97) for r in range(world)])
    reference_loss = summed_token_loss(model, everything) / everything["loss_mask"][:, 1:].sum()
    reference_loss.backward()
    reference = gradients(model).clone()

    # The common mistake, for comparison: mean loss per micro-batch, averaged over micro-batches.
    count = len(micro_batches) * world
    mistaken = accumulate(model, micro_batches, lambda mb: mb["loss_mask"][:, 1:].sum() * count, distributed)
    mistake = float((mistaken - reference).norm() / reference.norm())

    ok = bool(((accumulated - reference).abs() <= ATOL + RTOL * reference.abs()).all())
    flag = torch.tensor([1 if ok else 0])
    if distributed:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)

    if rank == 0:
        error = float((accumulated - reference).abs().max())
        print(f"{world} rank(s), {len(micro_batches)} micro-batches on rank 0 (cap {args.max_token_len}), "
              f"{int(global_tokens)} global loss tokens")
        print(f"batch loss (sum of token NLL / global loss tokens): {reference_loss.item():.6f}")
        print(f"per-micro-batch mean instead (the common mistake): gradient off by {mistake:.1%} (relative L2)")
        print(f"largest samples x longest: {largest} <= cap {args.max_token_len}")
        print(f"max |accumulated grad - full-batch grad| = {error:.2e}")
        print("check: " + ("OK, accumulated gradient equals the full-batch gradient" if flag.item() else "FAILED")
              + f" (atol={ATOL}, rtol={RTOL})")

    # 4. The optimizer step itself, on the accumulated (correctly normalised) gradient.
    offset = 0
    for parameter in model.parameters():
        parameter.grad.copy_(accumulated[offset : offset + parameter.numel()].view_as(parameter))
        offset += parameter.numel()
    optimizer.step()
    with torch.no_grad():
        after = summed_token_loss(model, everything) / everything["loss_mask"][:, 1:].sum()
    if rank == 0:
        print(f"one AdamW step: batch loss {reference_loss.item():.6f} -> {after.item():.6f}")
    if distributed:
        dist.destroy_process_group()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
