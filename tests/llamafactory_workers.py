"""Worker of tests/test_llamafactory.py: LLaMA-Factory 0.9.5's own ``BatchGenerator`` (its
``StatefulDistributedSampler``, ``StatefulDataLoader`` and ``StatefulBuffer``) with seqbal
installed, on every rank of a gloo group started by ``torchrun --standalone``.

Every sample's first token is its id (its other tokens are 5), so the collated micro-batches say
which samples a rank trained. Each rank writes what it saw to ``<out>/rank<r>.json``.

Usage: torchrun --standalone --nproc_per_node=N tests/llamafactory_workers.py SCENARIO OUT
  steps      many steps of ``dynamic_batching`` and ``dynamic_padding_free``, and a checkpoint
             of the generator resumed by a second generator;
  overlong   one sample longer than the cap in rank 1's stream only: every rank must raise;
  mismatch   rank 1 installs seqbal with another cap: every rank must raise.
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys

CAP = 96  # cutoff_len 24 x micro_batch_size 4: LLaMA-Factory's own budget, which seqbal keeps
CUTOFF_LEN, MICRO_BATCH_SIZE, NUM_MICRO_BATCH = 24, 4, 3
SAMPLES = 120
STEPS = 10


def lengths(overlong: bool) -> list[int]:
    """Every sample's length: 2 to 90 tokens (many over cutoff_len, which seqbal must not cut)."""
    rng = random.Random(7)
    out = [min(90, max(2, int(rng.lognormvariate(2.8, 0.8)))) for _ in range(SAMPLES)]
    if overlong:
        out[1] = CAP + 3  # index 1: in rank 1's stream (the sampler deals indices round-robin)
    return out


class Dataset:
    """A map-style dataset of (id, length) rows, as LLaMA-Factory's ``DataEngine`` is one."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict:
        return {"id": index, "length": self.sizes[index]}


class Renderer:
    """What ``BatchGenerator`` needs of LLaMA-Factory's renderer: ``process_samples``."""

    @staticmethod
    def process_samples(rows: list[dict]) -> list[dict]:
        out = []
        for row in rows:
            n = row["length"]
            ids = [row["id"] + 10] + [5] * (n - 1)  # ids >= 10: the pad value 0 is never an id
            out.append({"input_ids": ids, "attention_mask": [1] * n, "labels": ids, "loss_weights": [1.0] * n})
        return out


def micro_batch_record(batch: dict, strategy: str) -> dict:
    """Which samples a collated micro-batch holds, their lengths, and its shape."""
    ids = batch["input_ids"]
    if strategy == "dynamic_padding_free":  # one packed row; a sample starts where position_ids is 0
        positions = batch["position_ids"][0].tolist()
        starts = [i for i, p in enumerate(positions) if p == 0] + [len(positions)]
        samples = [int(ids[0, s]) - 10 for s in starts[:-1]]
        sizes = [b - a for a, b in zip(starts, starts[1:])]
    else:
        samples = [int(v) - 10 for v in ids[:, 0]]
        sizes = [int(v) for v in batch["attention_mask"].sum(-1)]
    return {"samples": samples, "lengths": sizes, "shape": list(ids.shape)}


def generator(strategy: str, sizes: list[int]):
    from llamafactory.v1.core.utils.batching import BatchGenerator

    return BatchGenerator(Dataset(sizes), Renderer(), micro_batch_size=MICRO_BATCH_SIZE,
                          global_batch_size=MICRO_BATCH_SIZE * NUM_MICRO_BATCH * int(os.environ["WORLD_SIZE"]),
                          cutoff_len=CUTOFF_LEN, batching_strategy=strategy, pin_memory=False, seed=3)


def steps_of(batches, count: int, strategy: str) -> list:
    out = []
    for _ in range(count):
        out.append([micro_batch_record(mb, strategy) for mb in next(batches)])
    return out


def main() -> int:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    from llamafactory.v1.accelerator.interface import DistributedInterface

    import seqbal.integrations.llamafactory as seqbal_llamafactory

    DistributedInterface()  # gloo on this CPU, as LLaMA-Factory's trainer would start it
    rank = int(os.environ["RANK"])
    seqbal_llamafactory.install(CAP + 8 if scenario == "mismatch" and rank == 1 else None)
    record: dict = {"rank": rank}
    if scenario == "steps":
        sizes = lengths(overlong=False)
        for strategy in ("dynamic_batching", "dynamic_padding_free"):
            batches = iter(generator(strategy, sizes))
            record[strategy] = steps_of(batches, STEPS, strategy)
        # a checkpoint after 9 steps (past a restart of the data provider): a second generator
        # resumed from it takes the same next steps. The copy is what saving it to disk does
        # (LLaMA-Factory's buffer state holds its live list).
        first = iter(generator("dynamic_batching", sizes))
        steps_of(first, 9, "dynamic_batching")
        state = copy.deepcopy(first.state_dict())
        record["uninterrupted"] = steps_of(first, 3, "dynamic_batching")
        second = generator("dynamic_batching", sizes)
        second.load_state_dict(state)
        record["resumed"] = steps_of(iter(second), 3, "dynamic_batching")
    elif scenario in ("overlong", "mismatch"):
        try:
            next(iter(generator("dynamic_batching", lengths(overlong=scenario == "overlong"))))
            record["error"] = None
        except ValueError as error:
            record["error"] = str(error)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as out:
        json.dump(record, out)
    DistributedInterface().destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
