"""axolotl's own sample packing (``MultipackBatchSampler``, its own code) beside seqbal's plug-in,
on real lengths, the way axolotl's trainer uses each.

Setting: ``sequence_len`` 4096 x ``micro_batch_size`` 2 (the cap of a packed micro-batch,
8192 tokens), ``sample_packing_bin_size`` 200 (axolotl's default), ``gradient_accumulation_steps``
``GA``, 4 and 8 data-parallel ranks; samples longer than ``sequence_len`` are removed first (axolotl's
default ``excess_length_strategy: drop``).

- ``axolotl``: ``MultipackBatchSampler`` over a ``RandomSampler``, one bin per micro-batch (axolotl's
  default, ``multipack_real_batches`` off), its count truncated as its ``__len__`` decides, and the
  bins dealt round-robin to the ranks (accelerate's ``BatchSamplerShard``, ``even_batches=False``).
- ``seqbal``: the plug-in's sampler (:class:`seqbal.epochs.sampler.TokenBudgetBatchSampler`).

Per route: micro-batches per epoch (all ranks) and per rank (``a/b`` when ranks differ: a rank
with more micro-batches than another waits in a collective the other never reaches, or the trainer
cuts it), samples trained per epoch, max tokens per forward, per-step rank imbalance (max over ranks
of a step's tokens / their mean, mean and worst over the steps every rank has), planning time for
an epoch (median of ``REPEATS``, as the trainer does it: axolotl's sampler built, counted and iterated;
seqbal's built and planned), and the loss weights: how far axolotl's normalisation is from the
step's global token mean (every token supervised), as half the L1 distance between the two weight
vectors over the step's tokens (0: the same gradient; 1: disjoint) and the largest ratio of a
token's weight to its global-token-mean weight, for axolotl's per-micro-batch normalisation (what
0.19.0 does for Llama-like models, whose inner forward does not name ``num_items_in_batch``) and its
per-rank one (``average_tokens_across_devices=False`` with ``num_items_in_batch``).

    python -m benchmarks.axolotl            # the table (docs/benchmarks.md, "axolotl")
    python -m benchmarks.axolotl --smoke    # seconds: a small slice
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np

from seqbal.epochs.sampler import TokenBudgetBatchSampler

from .trl import length_lists

SEQUENCE_LEN = 4096
MICRO = 2
CAP = SEQUENCE_LEN * MICRO
BIN_SIZE = 200
GA = 2
WORLDS = (4, 8)
REPEATS = 3


def axolotl_plan(lengths: np.ndarray, world: int, seed: int = 0) -> list[list[list[int]]]:
    """axolotl 0.19.0's packing of one epoch, its own code, dealt to ``world`` ranks."""
    import torch
    from axolotl.utils.samplers import MultipackBatchSampler
    from torch.utils.data import RandomSampler

    generator = torch.Generator().manual_seed(seed)
    sampler = MultipackBatchSampler(RandomSampler(range(len(lengths)), generator=generator), batch_size=1,
                                    batch_max_len=CAP, lengths=lengths, bin_size=BIN_SIZE, drop_last=True)
    len(sampler)  # axolotl's trainer counts first (its estimate and truncation)
    bins = [batch[0] for batch in sampler]
    return [bins[rank::world] for rank in range(world)]


def seqbal_plan(lengths: np.ndarray, world: int, seed: int = 0) -> list[list[list[int]]]:
    sampler = TokenBudgetBatchSampler(lengths.tolist(), CAP, num_replicas=world, rank=0, seed=seed,
                                      gradient_accumulation_steps=GA, max_samples_per_micro_batch=BIN_SIZE)
    return sampler.epoch_plan(0)


def loss_distance(lengths: np.ndarray, plan: list[list[list[int]]], per: str) -> tuple[float, float]:
    """Mean over the common steps of half the L1 distance between axolotl's token weights and the
    global token mean's, and the largest weight ratio. ``per``: "micro-batch" or "rank"."""
    world, steps = len(plan), min(len(rank) for rank in plan) // GA
    distances, worst = [], 0.0
    for step in range(steps):
        micro = [[int(lengths[mb].sum()) for mb in rank[step * GA:(step + 1) * GA]] for rank in plan]
        total = sum(map(sum, micro))
        l1 = 0.0
        for rank_micro in micro:
            for tokens in rank_micro:
                weight = 1 / (tokens * GA * world) if per == "micro-batch" else 1 / (sum(rank_micro) * world)
                l1 += tokens * abs(weight - 1 / total)
                worst = max(worst, weight * total)
        distances.append(l1 / 2)
    return float(np.mean(distances)), worst


def measure(name: str, lengths: np.ndarray, world: int, route: str, plan_fn: Callable) -> dict:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        plan = plan_fn(lengths, world)
        times.append(time.perf_counter() - start)
    counts = [len(rank) for rank in plan]
    steps = min(counts) // GA
    imbalance = []
    for step in range(steps):
        tokens = [sum(int(lengths[mb].sum()) for mb in rank[step * GA:(step + 1) * GA]) for rank in plan]
        imbalance.append(max(tokens) / (sum(tokens) / world))
    row = {
        "lengths": name, "world": world, "route": route, "micro_batches": sum(counts),
        "per_rank": f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}/{max(counts)}",
        "samples": sum(len(mb) for rank in plan for mb in rank), "of": len(lengths),
        "max_tokens": max(int(lengths[mb].sum()) for rank in plan for mb in rank),
        "imbalance_mean": float(np.mean(imbalance)), "imbalance_max": float(np.max(imbalance)),
        "plan_ms": 1000 * statistics.median(times),
    }
    if route == "axolotl":
        row["loss_micro"] = loss_distance(lengths, plan, "micro-batch")
        row["loss_rank"] = loss_distance(lengths, plan, "rank")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    options = parser.parse_args()
    lists = length_lists(limit=400 if options.smoke else None)
    worlds = (2,) if options.smoke else WORLDS
    axolotl_plan(np.array([5, 7], dtype=np.int64), 1)  # numba compiles axolotl's packer once, untimed
    print(f"cap {CAP} (sequence_len {SEQUENCE_LEN} x micro_batch_size {MICRO}), bin size {BIN_SIZE}, GA {GA}, "
          f"planning: median of {REPEATS}")
    print("| lengths | ranks | route | micro-batches (per rank) | samples | max tokens | imbalance mean / worst "
          "| plan ms | loss distance: per micro-batch / per rank (worst weight ratio) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, values in lists.items():
        lengths = values[values <= SEQUENCE_LEN].astype(np.int64)
        for world in worlds:
            rows = [measure(name, lengths, world, "axolotl", axolotl_plan), measure(name, lengths, world, "seqbal", seqbal_plan)]
            for row in rows:
                loss = ""
                if "loss_micro" in row:
                    (dm, wm), (dr, wr) = row["loss_micro"], row["loss_rank"]
                    loss = f"{dm:.3f} ({wm:.2f}x) / {dr:.3f} ({wr:.2f}x)"
                print(f"| {name} | {world} | {row['route']} | {row['micro_batches']} ({row['per_rank']}) | "
                      f"{row['samples']}/{row['of']} | {row['max_tokens']} | {row['imbalance_mean']:.3f} / "
                      f"{row['imbalance_max']:.3f} | {row['plan_ms']:.1f} | {loss} |")
                assert row["max_tokens"] <= CAP or row["route"] == "axolotl", row


if __name__ == "__main__":
    main()
