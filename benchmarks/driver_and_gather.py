"""Two more planning-cost ratios (the planning-cost targets of docs/benchmarks_method.md): the driver schedule and the copy around the plan.

    python -m benchmarks.driver_and_gather                 # both, 5 repeats: median and worst round
    python -m benchmarks.driver_and_gather --repeats 3 --caps 16384

1. ``build_dp_schedule`` on 32768 samples over 32 ranks, as a ratio to one
   best-fit-decreasing pass on the same lengths, for the long-response families of
   ``benchmarks/workloads.py`` (lognormal, bimodal, uniform, pareto, the Qwen rollouts) and
   GRPO groups (``force_group_size=8``), at caps 16384 and 32768 (``--caps``).
2. ``rearrange_micro_batches`` minus the plan, as a ratio to one gather of the whole batch
   (``batch[perm]``), on a verl-shaped batch: ``input_ids`` as a nested (jagged) tensor,
   a dense int64 ``attention_mask`` and ``position_ids``, and a per-sample ``uid``
   (4096 lognormal samples, cap 16384).

CPU time (``time.process_time``) in one process, measured side by side, each timed call after
a garbage collection; the median ratio over the repeats and the worst round are reported.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402
from seqbal import best_fit_decreasing_partitions, build_dp_schedule, plan_micro_batches  # noqa: E402


def cpu(fn) -> float:
    gc.collect()  # every timed call starts from the same collector state
    start = time.process_time()
    fn()
    return time.process_time() - start


SCHEDULE_FAMILIES = ("lognormal", "bimodal_rl", "uniform", "pareto", "real_qwen_rollouts", "grpo_groups")


def schedule_ratios(repeats: int, caps=(16384, 32768), n: int = 32768, dp: int = 32) -> list[str]:
    lines = ["| family | samples | ranks | cap | BFD pass ms | build_dp_schedule ms | ratio (median) | ratio (worst round) |",
             "|---|---|---|---|---|---|---|---|"]
    available = workloads.families()
    for family in SCHEDULE_FAMILIES:
        if family not in available:
            continue  # a real family without its length list
        for cap in caps:
            lengths, group = available[family](n, cap, workloads.case_seed(family, n, cap))
            ratios, bfds, plans = [], [], []
            for _ in range(repeats):
                bfd = cpu(lambda: best_fit_decreasing_partitions(lengths, cap))
                plan = cpu(lambda: build_dp_schedule(lengths, dp, cap, force_group_size=group))
                bfds.append(bfd)
                plans.append(plan)
                ratios.append(plan / bfd)
            lines.append(f"| {family} | {n} | {dp} | {cap} | {1e3 * min(bfds):.0f} | {1e3 * min(plans):.0f} | "
                         f"{statistics.median(ratios):.1f}x | {max(ratios):.1f}x |")
    return lines


def verl_batch(lengths):
    import torch
    from tensordict import TensorDict

    n, width = len(lengths), int(lengths.max())
    lengths_t = torch.as_tensor(lengths)
    mask = (torch.arange(width).unsqueeze(0) < lengths_t.unsqueeze(1)).long()
    ids = torch.nested.nested_tensor([torch.randint(0, 32000, (int(s),)) for s in lengths], layout=torch.jagged)
    return TensorDict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1, "uid": torch.arange(n)},
        batch_size=[n],
    )


def gather_ratio(repeats: int, n: int = 4096, cap: int = 16384) -> list[str]:
    import torch

    from seqbal import rearrange_micro_batches

    torch.set_num_threads(1)
    lengths, _ = workloads.lognormal(n, cap, workloads.case_seed("lognormal", n, cap))
    batch = verl_batch(lengths)
    perm = torch.randperm(n)
    rearrange_micro_batches(batch, cap)  # warm-up
    ratios, gathers, extras = [], [], []
    for _ in range(repeats):
        gather = cpu(lambda: batch[perm])
        call = cpu(lambda: rearrange_micro_batches(batch, cap))
        plan = cpu(lambda: plan_micro_batches(lengths, cap))
        gathers.append(gather)
        extras.append(call - plan)
        ratios.append((call - plan) / gather)
    return [
        "| batch | gather `batch[perm]` ms | rearrange minus plan ms | ratio (median) | ratio (worst round) |",
        "|---|---|---|---|---|",
        f"| {n} samples, nested input_ids, dense mask, position_ids, uid; cap {cap} | {1e3 * min(gathers):.0f} | "
        f"{1e3 * min(extras):.0f} | {statistics.median(ratios):.2f}x | {max(ratios):.2f}x |",
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--caps", nargs="*", type=int, default=[16384, 32768])
    parser.add_argument("--skip-gather", action="store_true")
    args = parser.parse_args(argv)
    print("\n".join(schedule_ratios(args.repeats, args.caps)), flush=True)
    if not args.skip_gather:
        print()
        print("\n".join(gather_ratio(args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
