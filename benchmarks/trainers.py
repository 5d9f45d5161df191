"""seqbal against OpenRLHF 0.11.2's and AReaL 1.0.4's own planners, on seqbal's shipped lengths.

Single process, no collective: each planner on the same random steps of
seqbal/data/qwen25math_cot_rollouts.txt at cap 4096. Reports, per planner, the total
micro-batch count, how many steps went over the cap, the largest micro-batch and the median
planning time per step. Run in an environment with the trainer installed:

    PYTHONPATH=. python benchmarks/trainers.py openrlhf   # OpenRLHF's training step and rollout split
    PYTHONPATH=. python benchmarks/trainers.py areal      # AReaL's allocate_balanced_mbs (ffd, kk)
"""

from __future__ import annotations

import statistics
import sys
import time
from importlib.resources import files

import numpy as np

import seqbal
from seqbal.integrations.openrlhf import plan_rollout_split

CAP = 4096


def steps(count, size, seed):
    lengths = np.loadtxt(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt", dtype=np.int64)
    rng = np.random.default_rng(seed)
    return [lengths[rng.choice(len(lengths), size, replace=False)].tolist() for _ in range(count)]


def measure(name, planner, batches):
    counts, over, worst, times = 0, 0, 0, []
    for lens in batches:
        start = time.perf_counter()
        parts = planner(lens)
        times.append(time.perf_counter() - start)
        sums = [sum(lens[i] for i in part) for part in parts]
        counts += len(parts)
        over += max(sums) > CAP
        worst = max(worst, max(sums))
    print(f"{name:42s} count {counts:6d}  steps over cap {over:4d}  largest {worst:5d}  median {1e3 * statistics.median(times):.3f} ms")


def main(trainer):
    training = steps(500, 32, 0)
    rollouts = steps(100, 128, 1)
    if trainer == "openrlhf":
        sys.path.insert(0, "tests")
        from openrlhf.utils.seqlen_balancing import get_minimum_num_micro_batch_size as first_fit
        from openrlhf.utils.seqlen_balancing import get_seqlen_balanced_partitions as kk

        print("training step: 500 steps of 32 samples")
        measure("OpenRLHF setup_dynamic_batch plan", lambda l: kk(l, first_fit(l, CAP, 1, 1), False), training)
        measure("seqbal plan_micro_batches", lambda l: seqbal.plan_micro_batches(l, CAP), training)
        print("rollout split: 100 rollouts of 128 samples, 4 actors")
        measure("OpenRLHF split_rollout_samples plan", lambda l: kk(l, max(first_fit(l, CAP, 1, 1) // 4 * 4, 4), False), rollouts)
        measure("seqbal plan_rollout_split", lambda l: plan_rollout_split(l, CAP, 4), rollouts)
    else:
        from types import SimpleNamespace

        from areal.utils.data import allocate_balanced_mbs

        print("AReaL: 500 steps of 32 samples")
        for algorithm in ("ffd", "kk"):
            spec = SimpleNamespace(max_tokens_per_mb=CAP, n_mbs=1, n_mbs_divisor=1, packing_algorithm=algorithm)
            measure(f"AReaL allocate_balanced_mbs ({algorithm})", lambda l, s=spec: allocate_balanced_mbs(s, l), training)
        measure("seqbal plan_micro_batches", lambda l: seqbal.plan_micro_batches(l, CAP), training)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "openrlhf")
