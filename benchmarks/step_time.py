"""Step time of the data-parallel routes: efficiency under both sync models, counts, planning time.

    python -m benchmarks.step_time            # the grid below, a few minutes; Markdown on stdout
    python -m benchmarks.step_time --quick    # seconds: one length list, a few cases (smoke test)
    python -m benchmarks.step_time --verl-all # verl's real loop on every case, not only 256 per rank

A step's cost is modelled on the workload ``24576*L + L**2`` of every sample (seqbal's default,
verl's ``calculate_workload``). ``W[r][i]`` is the work of rank ``r``'s ``i``-th micro-batch and
``limit = sum(W) / dp`` the step of a perfect split. Efficiency is ``limit / step``:

* per micro-batch sync (FSDP: parameters are gathered in every micro-batch's forward and
  backward, ranks wait for each other each time): ``step = sum_i max_r W[r][i]``;
* per step sync (DDP: one gradient all-reduce): ``step = max_r sum_i W[r][i]``.

Routes, on the same global batch each:

* ``per rank``: the driver's balance (verl 0.9.1's own ``get_seqlen_balanced_partitions`` with
  ``equal_size=True`` on ``calculate_workload``, as ``RayPPOTrainer._balance_batch`` calls it;
  seqbal's ``balance_batch`` where verl is absent), then ``seqbal.plan_micro_batches`` on every
  rank, the count agreed as ``same_micro_num_in_dp`` does (every rank re-planned at the largest
  count until all agree);
* ``schedule``: ``seqbal.build_dp_schedule`` (and with ``equal_samples=True``);
* ``verl 0.9.1``: the same driver balance, then verl's own ``rearrange_micro_batches`` strict
  loop on every rank, run in lock-step as its all-reduces would (re-run at the largest count
  until every rank fits); only where verl is installed, and by default only on the 256
  samples-per-rank half of the grid (its loop takes seconds per rank at 1,024);
* ``slime (re-implementation)``: slime's ``build_dp_schedule`` route rewritten here on seqbal's
  primitives (first-fit packing in input order, largest multi-sample bins halved up to a
  multiple of ``dp``, KK with equal sizes on bin token sums, each rank's bins in index order).

Grid: every real length list (``seqbal/data`` and ``/work/shared/data/lengths``), dp 4, 8, 16,
256 and 1,024 samples per rank, caps 4096, 8192, 16384. A global batch is the list shuffled
(seeded), repeated when the list is shorter than ``dp * samples per rank``, clipped to the cap.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

if __package__ in (None, ""):  # allow `python benchmarks/step_time.py` too
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_schedule import lengths_dir  # noqa: E402
from seqbal import (  # noqa: E402
    balance_batch,
    build_dp_schedule,
    calculate_workload,
    first_fit_partitions,
    karmarkar_karp,
    packing_lower_bound,
    plan_micro_batches,
)

SHIPPED = Path(str(resources.files("seqbal") / "data"))  # the installed package's lengths
SEED = 20261201
DPS = (4, 8, 16)
PER_RANK = (256, 1024)
CAPS = (4096, 8192, 16384)

RankParts = list[list[list[int]]]  # per rank, per micro-batch (in run order), global sample indices


def length_files() -> dict[str, Path]:
    """Every real length list, by file name (the shared directory wins over the packaged copy)."""
    files = {p.name: p for p in sorted(SHIPPED.glob("*.txt"))}
    directory = lengths_dir()
    if directory is not None:
        files.update({p.name: p for p in sorted(directory.glob("*.txt"))})
    return files


def global_batch(path: Path, n: int, cap: int) -> np.ndarray:
    data = np.loadtxt(path, dtype=np.int64)
    rng = np.random.default_rng([SEED, n])
    order = np.concatenate([rng.permutation(len(data)) for _ in range(-(-n // len(data)))])[:n]
    return np.minimum(data[order], cap)


# ---------------------------------------------------------------------------------------------
# Efficiency
# ---------------------------------------------------------------------------------------------


def efficiency(lengths: np.ndarray, ranks: RankParts) -> tuple[float, float]:
    """(per micro-batch sync, per step sync) efficiency of a layout; ranks must have equal counts."""
    work = calculate_workload(lengths)
    counts = {len(r) for r in ranks}
    if len(counts) != 1:
        raise ValueError(f"ranks run different counts {sorted(counts)}: not a synced layout")
    grid = np.array([[int(work[mb].sum()) for mb in rank] for rank in ranks], dtype=np.float64)
    limit = grid.sum() / len(ranks)
    return float(limit / grid.max(axis=0).sum()), float(limit / grid.sum(axis=1).max())


# ---------------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------------


def verl_module():
    try:
        from verl.utils import seqlen_balancing
    except Exception:  # noqa: BLE001 - verl absent or broken: its rows are skipped
        return None
    return seqlen_balancing


def driver_balance(lengths: np.ndarray, dp: int) -> list[list[int]]:
    """verl's driver-side split (its own code where installed), shares in ascending index order."""
    verl = verl_module()
    if verl is None:
        return balance_batch(lengths, dp)[0]
    import torch

    workload = verl.calculate_workload(torch.as_tensor(lengths))
    return [sorted(p) for p in verl.get_seqlen_balanced_partitions(workload, k_partitions=dp, equal_size=True)]


def lockstep(plan_at: Callable[[np.ndarray, Optional[int]], list[list[int]]], shares: list[list[int]]) -> RankParts:
    """Every share planned, then all re-planned at the largest count until every rank agrees:
    what the MAX all-reduce of the count and the MIN all-reduce of ``within_limit`` do."""
    shares = [np.asarray(s, dtype=np.int64) for s in shares]
    plans = [plan_at(s, None) for s in shares]
    for _ in range(64):
        count = max(len(p) for p in plans)
        if all(len(p) == count for p in plans):
            break
        plans = [p if len(p) == count else plan_at(s, count) for s, p in zip(shares, plans)]
    return [[[int(s[i]) for i in mb] for mb in plan] for s, plan in zip(shares, plans)]


def per_rank_route(lengths: np.ndarray, dp: int, cap: int) -> RankParts:
    def plan(share: np.ndarray, count: Optional[int]) -> list[list[int]]:
        return plan_micro_batches(lengths[share], cap, min_num_micro_batch=count)

    return lockstep(plan, driver_balance(lengths, dp))


def schedule_route(lengths: np.ndarray, dp: int, cap: int, equal_samples: bool = False) -> RankParts:
    schedule = build_dp_schedule(lengths, dp, cap, equal_samples=equal_samples)
    return [[list(mb) for mb in rank] for rank in schedule.micro_batches]


def verl_route(lengths: np.ndarray, dp: int, cap: int) -> RankParts:
    verl = verl_module()
    import torch
    from tensordict import TensorDict

    def plan(share: np.ndarray, count: Optional[int]) -> list[list[int]]:
        values = torch.as_tensor(lengths[share])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), values.cumsum(0)])
        ids = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1]), dtype=torch.long), offsets)
        batch = TensorDict({"input_ids": ids}, batch_size=[len(share)])
        return verl.rearrange_micro_batches(batch, cap, min_num_micro_batch=count)[1]

    return lockstep(plan, driver_balance(lengths, dp))


def slime_route(lengths: np.ndarray, dp: int, cap: int) -> RankParts:
    """slime's pack-first schedule, re-implemented on seqbal's primitives (not slime's code)."""
    bins = first_fit_partitions(lengths, cap)
    target = max(-(-len(bins) // dp) * dp, dp)
    while len(bins) < target:
        splittable = [b for b in range(len(bins)) if len(bins[b]) > 1]
        if not splittable:
            raise ValueError(f"slime route: {len(bins)} bins cannot be split up to {target}")
        b = max(splittable, key=lambda b: (int(lengths[bins[b]].sum()), -b))
        half = len(bins[b]) // 2
        bins.append(bins[b][half:])
        bins[b] = bins[b][:half]
    sums = [int(lengths[b].sum()) for b in bins]
    ranks = karmarkar_karp(sums, dp, equal_size=True)
    return [[list(bins[b]) for b in sorted(rank)] for rank in ranks]


ROUTES: dict[str, Callable[[np.ndarray, int, int], RankParts]] = {
    "per rank (verl's driver balance + seqbal.plan_micro_batches)": per_rank_route,
    "build_dp_schedule": schedule_route,
    "build_dp_schedule(equal_samples=True)": lambda lengths, dp, cap: schedule_route(lengths, dp, cap, True),
    "verl 0.9.1 (driver balance + its rearrange_micro_batches loop)": verl_route,
    "slime build_dp_schedule (re-implementation)": slime_route,
}
VERL = "verl 0.9.1 (driver balance + its rearrange_micro_batches loop)"
PER_RANK_ROUTE = "per rank (verl's driver balance + seqbal.plan_micro_batches)"


def run_case(case: tuple[str, int, int, int, bool]) -> list[dict]:
    """Every route on one case (file, dp, samples per rank, cap, with verl): one row per route."""
    name, dp, n_rank, cap, with_verl = case
    data = np.loadtxt(length_files()[name], dtype=np.int64)
    lengths = global_batch(length_files()[name], dp * n_rank, cap)
    bound = -(-(-(-int(lengths.sum()) // cap)) // dp)
    packing = -(-packing_lower_bound(lengths, cap) // dp)
    rows = []
    for route, fn in ROUTES.items():
        if route == VERL and not with_verl:
            continue
        start = time.perf_counter()
        ranks = fn(lengths, dp, cap)
        seconds = time.perf_counter() - start
        per_mb, per_step = efficiency(lengths, ranks)
        rows.append(dict(
            file=name, dp=dp, per_rank=n_rank, cap=cap, clipped=bool(data.max() > cap), route=route, per_mb=per_mb,
            per_step=per_step, count=len(ranks[0]), bound=bound, packing_bound=packing, seconds=seconds,
        ))
    return rows


def run_grid(
    names: Sequence[str], dps: Sequence[int], per_rank: Sequence[int], caps: Sequence[int], *, verl_all: bool,
    jobs: int = 1, log: Callable[..., None] = print,
) -> list[dict]:
    """One row per (case, route): efficiencies, count per rank, both lower bounds, seconds.
    ``jobs > 1`` runs cases in that many processes (the planning seconds are then noisier)."""
    have_verl = verl_module() is not None
    cases = [(name, dp, n, cap, have_verl and (verl_all or n == min(per_rank)))
             for name in names for dp in dps for n in per_rank for cap in caps]
    rows: list[dict] = []
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            for case, result in zip(cases, pool.map(run_case, cases)):
                rows.extend(result)
                log(f"{case[0]} dp={case[1]} n/rank={case[2]} cap={case[3]} done", file=sys.stderr, flush=True)
        return rows
    for case in cases:
        rows.extend(run_case(case))
        log(f"{case[0]} dp={case[1]} n/rank={case[2]} cap={case[3]} done", file=sys.stderr, flush=True)
    return rows


def efficiency_table(rows: list[dict]) -> list[str]:
    lines = [
        "| route | cases | per micro-batch sync: worst | mean | per step sync: worst | mean "
        "| micro-batches per rank above the packing bound: mean / max | planning s (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for route in ROUTES:
        mine = [r for r in rows if r["route"] == route]
        if not mine:
            continue
        above = [r["count"] - r["packing_bound"] for r in mine]
        lines.append(
            f"| {route} | {len(mine)} | {min(r['per_mb'] for r in mine):.4f} | {np.mean([r['per_mb'] for r in mine]):.4f} "
            f"| {min(r['per_step'] for r in mine):.4f} | {np.mean([r['per_step'] for r in mine]):.4f} "
            f"| {np.mean(above):.2f} / {max(above)} | {statistics.median(r['seconds'] for r in mine):.2f} |"
        )
    return lines


def worst_cases(rows: list[dict]) -> list[str]:
    """Per route, the case of its worst per-micro-batch efficiency, and the schedule against the
    per-rank route case by case."""
    lines = ["| route | worst case (file, dp, samples per rank, cap) | per micro-batch | per step | count / packing bound |",
             "|---|---|---|---|---|"]
    for route in ROUTES:
        mine = [r for r in rows if r["route"] == route]
        if mine:
            w = min(mine, key=lambda r: r["per_mb"])
            lines.append(f"| {route} | {w['file']}, {w['dp']}, {w['per_rank']}, {w['cap']} | {w['per_mb']:.4f} "
                         f"| {w['per_step']:.4f} | {w['count']} / {w['packing_bound']} |")
    return lines


def below_per_rank(rows: list[dict], route: str) -> list[dict]:
    """Cases where ``route``'s per-micro-batch efficiency is below the per-rank route's."""
    key = lambda r: (r["file"], r["dp"], r["per_rank"], r["cap"])  # noqa: E731
    base = {key(r): r["per_mb"] for r in rows if r["route"] == PER_RANK_ROUTE}
    return [r for r in rows if r["route"] == route and key(r) in base and r["per_mb"] < base[key(r)] - 1e-12]


# ---------------------------------------------------------------------------------------------
# Planning time: seqbal's rearrange_micro_batches against verl's, one rank's batch
# ---------------------------------------------------------------------------------------------


def planning_time(cases: Sequence[tuple[str, int, int]], rounds: int) -> list[str]:
    import torch
    from tensordict import TensorDict

    from seqbal import rearrange_micro_batches

    verl = verl_module()
    files = length_files()
    lines = ["| length list | samples | cap | seqbal s | verl 0.9.1 s | verl / seqbal | seqbal count | verl count |",
             "|---|---|---|---|---|---|---|---|"]
    for name, n, cap in cases:
        lengths = torch.as_tensor(global_batch(files[name], n, cap))
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        ids = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1]), dtype=torch.long), offsets)
        batch = TensorDict({"input_ids": ids}, batch_size=[n])
        ours, theirs, counts = [], [], [None, None]
        for _ in range(rounds):  # interleaved, so both see the same machine load
            start = time.perf_counter()
            counts[0] = len(rearrange_micro_batches(batch, cap)[1])
            ours.append(time.perf_counter() - start)
            if verl is not None:
                start = time.perf_counter()
                counts[1] = len(verl.rearrange_micro_batches(batch, cap)[1])
                theirs.append(time.perf_counter() - start)
        a = statistics.median(ours)
        b = statistics.median(theirs) if theirs else None
        lines.append(f"| {name} | {n} | {cap} | {a:.3f} | {'-' if b is None else f'{b:.2f}'} "
                     f"| {'-' if b is None else f'{b / a:.0f}x'} | {counts[0]} | {counts[1] or '-'} |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one length list, dp 4 and 8, 256 per rank, cap 4096")
    parser.add_argument("--verl-all", action="store_true", help="verl's loop on 1,024 samples per rank too (slow)")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="processes for the grid")
    parser.add_argument("--json", help="also write every row to this JSON file")
    args = parser.parse_args(argv)
    files = length_files()
    if args.quick:
        names, dps, per_rank, caps = ["qwen25math_cot_rollouts.txt"], (4, 8), (64, 256), (4096,)
        timing, rounds = [("qwen25math_cot_rollouts.txt", 256, 4096)], 1
    else:
        names, dps, per_rank, caps = sorted(files), DPS, PER_RANK, CAPS
        timing = [("qwen25math_cot_rollouts.txt", 800, 4096), ("alpaca_eval_outputs.txt", 2048, 8192),
                  ("math_test.txt", 2048, 8192)]
        rounds = 3
    started = time.perf_counter()
    rows = run_grid(names, dps, per_rank, caps, verl_all=args.verl_all, jobs=args.jobs)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    kept = [r for r in rows if not r["clipped"]]
    clipped = [r for r in rows if r["clipped"]]
    cases = len({(r["file"], r["dp"], r["per_rank"], r["cap"]) for r in kept})
    print(f"<!-- python -m benchmarks.step_time{' --quick' if args.quick else ''}: python {platform.python_version()}, "
          f"numpy {np.__version__}, {platform.machine()}, {cases} cases -->\n")
    print(f"#### Step efficiency, {cases} cases (caps at or above the list's longest sample)\n")
    print("\n".join(efficiency_table(kept)))
    print("\n#### Worst case per route\n")
    print("\n".join(worst_cases(kept)))
    for route in ("build_dp_schedule", "build_dp_schedule(equal_samples=True)"):
        low = below_per_rank(kept, route)
        print(f"\n`{route}` below the per-rank route (per micro-batch sync): {len(low)} case(s)"
              + "".join(f"; {r['file']} dp {r['dp']} n {r['per_rank']} cap {r['cap']}: {r['per_mb']:.5f}" for r in low))
    if clipped:
        n_clipped = len({(r["file"], r["dp"], r["per_rank"], r["cap"]) for r in clipped})
        print(f"\n#### Clipped cases: {n_clipped} with samples longer than the cap, clipped to it\n")
        print("\n".join(efficiency_table(clipped)))
    print("\n#### Planning time per call, one rank's batch (`rearrange_micro_batches`, median of "
          f"{rounds} round(s))\n")
    print("\n".join(planning_time(timing, rounds)))
    print(f"\n<!-- total {time.perf_counter() - started:.0f} s -->")


if __name__ == "__main__":
    main()
