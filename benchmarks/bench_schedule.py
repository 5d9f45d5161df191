"""Global DP schedule versus the per-rank route, and first-fit versus best-fit packers.

Route A, the schedule: ``build_dp_schedule(lengths, dp, cap)`` packs the whole batch, then hands
equal bin counts to the ranks. Route B, per rank: ``balance_batch(lengths, dp)`` splits the batch
over ranks (KK, equal sample counts), then every rank finds its own smallest feasible count
with ``plan_micro_batches(..., use_dynamic_bsz_balance=False)``; all ranks must run the largest
of those counts (what ``same_micro_num_in_dp`` agrees on). Reported per row, averaged over the
batches: micro-batches per rank for both routes, the per-rank lower bound
``ceil(packing_lower_bound(batch) / dp)``, how often A needs fewer / as many / more than B, and
the per-rank workload imbalance (max / mean of the ranks' total workloads, 1.0 is perfect).

The packer table compares, on the same batches, the bins of first-fit (input order), first-fit
decreasing and best-fit decreasing with the Martello-Toth lower bound.

The planning-cost mode times ``build_dp_schedule`` on one large global batch (32,768 samples
over 32 ranks by default) of every workload above, at caps 16384 and 32768, as a ratio to one
plain best-fit-decreasing pass (``best_fit_decreasing_partitions``) on the same lengths: CPU
time (``time.process_time``) in one process, the two calls side by side after a garbage
collection, rounds interleaved over the cases, the median ratio and the worst round reported
with the schedule's count and step efficiency (the yardstick of ``benchmarks.planning_cost``
and ``benchmarks.scale``).

Run from the repository root::

    python benchmarks/bench_schedule.py            # prints the Markdown tables
    python benchmarks/bench_schedule.py --quick    # fewer batches, for a smoke run
    python benchmarks/bench_schedule.py --planning-cost [--rounds 5] [--json out.json]
    python benchmarks/bench_schedule.py --planning-cost --ref ../other-checkout   # side by side

With ``--ref`` the planning-cost mode also times another checkout's ``build_dp_schedule`` (its
package imported as ``seqbal_ref``, as ``benchmarks/planning_ab.py`` does) in the same rounds,
the two calls in alternating order, and checks that both return the same schedule: two runs of
the plain mode, one per tree, differ by 20-30% with the machine's load alone.

Real length lists are read from ``$SEQBAL_LENGTHS_DIR``, else ``<repo>/../shared/data/lengths``
or ``<repo>/../../shared/data/lengths``; rows for them are skipped if none is found.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from seqbal import (  # noqa: E402
    balance_batch,
    best_fit_decreasing_partitions,
    build_dp_schedule,
    calculate_workload,
    first_fit_partitions,
    packing_lower_bound,
    plan_micro_batches,
)

BATCH = 1024  # default samples per global batch (e.g. 128 prompts x 8 responses); --batch changes it
GRPO_N = 8  # responses per prompt in the GRPO workload
SEED = 20261129


# ---------------------------------------------------------------------------------------------
# Workloads: each yields (lengths, group_ids or None) per batch
# ---------------------------------------------------------------------------------------------


def _clip(x: np.ndarray, cap: int) -> np.ndarray:
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def lognormal(rng: np.random.Generator, cap: int, n: int) -> np.ndarray:
    """SFT-like: median ~700 tokens, sigma 0.8."""
    return _clip(rng.lognormal(np.log(700), 0.8, n), cap)


def bimodal_rl(rng: np.random.Generator, cap: int, n: int) -> np.ndarray:
    """RL rollouts: 75% short answers (~400), 25% long reasoning (~4000), both noisy."""
    long = rng.random(n) < 0.25
    return _clip(np.where(long, rng.normal(4000, 1200, n), rng.normal(400, 150, n)), cap)


def pareto_tail(rng: np.random.Generator, cap: int, n: int) -> np.ndarray:
    """Heavy tail: Pareto alpha 1.1 above 300 tokens, clipped at the cap."""
    return _clip(300 * (1 + rng.pareto(1.1, n)), cap)


def grpo_groups(rng: np.random.Generator, cap: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """GRPO: 128 prompts x 8 responses; a prompt's responses share a difficulty scale."""
    prompts = n // GRPO_N
    scale = rng.lognormal(np.log(600), 0.7, prompts)
    lengths = rng.lognormal(0, 0.5, (prompts, GRPO_N)) * scale[:, None] + rng.integers(50, 300, prompts)[:, None]
    return _clip(lengths.ravel(), cap), np.repeat(np.arange(prompts), GRPO_N)


def grpo_groups_kept(rng: np.random.Generator, cap: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """GRPO with every prompt's 8 responses in one micro-batch: samples clipped to cap / 8."""
    lengths, groups = grpo_groups(rng, cap // GRPO_N, n)
    return lengths, groups


GENERATED: dict[str, Callable] = {
    "lognormal": lognormal,
    "bimodal RL": bimodal_rl,
    "Pareto tail": pareto_tail,
    "GRPO (free)": grpo_groups,
    "GRPO (groups kept)": grpo_groups_kept,
}


def lengths_dir() -> Optional[Path]:
    candidates = [os.environ.get("SEQBAL_LENGTHS_DIR")]
    candidates += [str(REPO.parent / "shared" / "data" / "lengths"), str(REPO.parent.parent / "shared" / "data" / "lengths")]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def batches(name: str, cap: int, count: int, batch: int = BATCH) -> Iterator[tuple[np.ndarray, Optional[np.ndarray]]]:
    """``count`` batches of ``batch`` samples of one workload (real files: consecutive slices)."""
    if name in GENERATED:
        rng = np.random.default_rng([SEED, sum(map(ord, name)), cap, batch])
        for _ in range(count):
            out = GENERATED[name](rng, cap, batch)
            yield out if isinstance(out, tuple) else (out, None)
        return
    directory = lengths_dir()
    assert directory is not None
    data = np.loadtxt(directory / name, dtype=np.int64)
    data = np.minimum(data, cap)  # no real file reaches 8192; kept for other caps
    rng = np.random.default_rng(SEED)
    data = data[rng.permutation(len(data))]  # a shuffled epoch, as a dataloader would give
    size = min(batch, len(data) // 8 * 8)  # the 800-line rollout file gives one batch of 800
    for start in range(0, min(count, len(data) // size) * size, size):
        yield data[start:start + size], None


#: The families ``benchmarks.driver_and_gather`` times the schedule on (``benchmarks/workloads.py``),
#: which the planning-cost mode runs too, under their names with this suffix.
WORKLOAD_FAMILIES = ("lognormal", "bimodal_rl", "uniform", "pareto", "real_qwen_rollouts", "grpo_groups")
WORKLOADS = " (workloads.py)"


def large_batch(name: str, cap: int, n: int) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """One batch of ``n`` samples: a generated workload's first batch (GRPO (groups kept): every
    prompt's 8 responses within ``cap``), or a real list drawn with replacement (seeded), clipped."""
    if name in GENERATED:
        return next(batches(name, cap, 1, n))
    if name.endswith(WORKLOADS):  # the families of benchmarks.driver_and_gather (and docs/benchmarks_method.md)
        from benchmarks import workloads

        family = name[: -len(WORKLOADS)]
        lengths, group = workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))
        return lengths, (np.arange(n) // group if group > 1 else None)
    directory = lengths_dir()
    assert directory is not None
    data = np.loadtxt(directory / name, dtype=np.int64)
    rng = np.random.default_rng([SEED, n, cap])
    return np.minimum(data[rng.integers(0, len(data), n)], cap), None


def planning_cost_names() -> list[str]:
    """The workloads of the planning-cost mode, in its order: the generated ones, the real lists
    and the families of ``benchmarks.driver_and_gather`` (those drawn from a real list only where
    the lists are found)."""
    from benchmarks import workloads

    names = list(GENERATED)
    directory = lengths_dir()
    if directory is not None:
        names += sorted(p.name for p in directory.glob("*.txt"))
    available = workloads.families()
    return names + [family + WORKLOADS for family in WORKLOAD_FAMILIES if family in available]


def planning_cost_case(name: str, cap: int, n: int) -> tuple[np.ndarray, Optional[list]]:
    """One planning-cost batch: its lengths, and its group ids where the workload keeps groups
    whole (GRPO, groups kept), else None."""
    lengths, groups = large_batch(name, cap, n)
    keep = name == "GRPO (groups kept)" or name == "grpo_groups" + WORKLOADS
    return lengths, groups.tolist() if keep and groups is not None else None


# ---------------------------------------------------------------------------------------------
# The two routes
# ---------------------------------------------------------------------------------------------


def imbalance(lengths: np.ndarray, parts: list[list[int]]) -> float:
    work = calculate_workload(lengths)
    totals = np.array([work[p].sum() for p in parts], dtype=np.float64)
    return float(totals.max() / totals.mean())


def per_rank_route(lengths: np.ndarray, groups: Optional[np.ndarray], dp: int, cap: int, keep: bool) -> tuple[int, float]:
    parts, _ = balance_batch(lengths, dp, group_ids=None if groups is None else groups.tolist())
    counts = []
    for p in parts:
        # group members are contiguous within a rank's ascending indices, so force_group_size keeps them
        g = GRPO_N if keep else 1
        counts.append(len(plan_micro_batches(lengths[p], cap, use_dynamic_bsz_balance=False, force_group_size=g)))
    return max(counts), imbalance(lengths, parts)


def schedule_route(lengths: np.ndarray, groups: Optional[np.ndarray], dp: int, cap: int, keep: bool) -> tuple[int, float, float]:
    start = time.perf_counter()
    schedule = build_dp_schedule(lengths, dp, cap, group_ids=groups.tolist() if keep else None)
    elapsed = time.perf_counter() - start
    return schedule.num_micro_batches, schedule.summary()["rank_workload_imbalance"], elapsed


def compare(names: list[str], caps: dict[str, int], dps: list[int], count: int, batch: int) -> list[str]:
    rows = [
        "| workload | cap | dp | batches | LB/rank | schedule | per-rank route | fewer / same / more "
        "| imbalance schedule | imbalance per-rank | schedule ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        cap = caps[name]
        data = list(batches(name, cap, count, batch))
        keep = name == "GRPO (groups kept)"
        for dp in dps:
            a, b, lb, ia, ib, ms = [], [], [], [], [], []
            for lengths, groups in data:
                count_a, imb_a, seconds = schedule_route(lengths, groups, dp, cap, keep)
                count_b, imb_b = per_rank_route(lengths, groups if name.startswith("GRPO") else None, dp, cap, keep)
                tokens = lengths if not keep else np.bincount(groups, weights=lengths).astype(np.int64)
                a.append(count_a), b.append(count_b), ia.append(imb_a), ib.append(imb_b), ms.append(seconds * 1e3)
                lb.append(-(-packing_lower_bound(tokens, cap) // dp))
            a_, b_ = np.array(a), np.array(b)
            rows.append(
                f"| {name} | {cap} | {dp} | {len(data)} | {np.mean(lb):.2f} | {a_.mean():.2f} | {b_.mean():.2f} "
                f"| {(a_ < b_).sum()} / {(a_ == b_).sum()} / {(a_ > b_).sum()} | {np.mean(ia):.4f} | {np.mean(ib):.4f} "
                f"| {np.median(ms):.0f} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def packers(names: list[str], caps: dict[str, int], count: int, batch: int) -> list[str]:
    rows = [
        "| workload | cap | batches | lower bound | first-fit | FFD | BFD | BFD < FFD | BFD > FFD | BFD above LB | BFD ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        if name == "GRPO (groups kept)":
            continue
        cap = caps[name]
        lb, ff, ffd, bfd, ms = [], [], [], [], []
        for lengths, _ in batches(name, cap, count, batch):
            lb.append(packing_lower_bound(lengths, cap))
            ff.append(len(first_fit_partitions(lengths, cap)))
            ffd.append(len(first_fit_partitions(lengths, cap, decreasing=True)))
            start = time.perf_counter()
            bfd.append(len(best_fit_decreasing_partitions(lengths, cap)))
            ms.append((time.perf_counter() - start) * 1e3)
        lb_, ffd_, bfd_ = np.array(lb), np.array(ffd), np.array(bfd)
        rows.append(
            f"| {name} | {cap} | {len(lb)} | {lb_.mean():.2f} | {np.mean(ff):.2f} | {ffd_.mean():.2f} | {bfd_.mean():.2f} "
            f"| {(bfd_ < ffd_).sum()} | {(bfd_ > ffd_).sum()} | {(bfd_ > lb_).sum()} | {np.median(ms):.1f} |"
        )
    return rows


def planning_cost(
    names: list[str], caps: list[int], n: int, dp: int, rounds: int, json_path: Optional[str] = None,
    reference: Optional[Callable[..., object]] = None,
) -> list[str]:
    """``build_dp_schedule`` on ``n`` samples over ``dp`` ranks, in plain BFD passes (see the module
    docstring); one row per workload and cap. ``reference``: another tree's ``build_dp_schedule``,
    timed in the same rounds (order alternating) and checked to return the same schedule."""
    import gc
    import json
    import statistics

    def cpu(fn: Callable[[], object]) -> float:
        gc.collect()  # every timed call starts from the same collector state
        start = time.process_time()
        fn()
        return time.process_time() - start

    cases = [(name, cap, *planning_cost_case(name, cap, n)) for name in names for cap in caps]
    times: dict[tuple[str, int], list[tuple[float, float]]] = {(c[0], c[1]): [] for c in cases}
    ref_times: dict[tuple[str, int], list[float]] = {(c[0], c[1]): [] for c in cases}
    results, same = {}, {}
    for round_index in range(rounds):  # interleaved, so a burst of load hits one round of every case
        for name, cap, lengths, group_ids in cases:
            bfd = cpu(lambda: best_fit_decreasing_partitions(lengths, cap))
            built = {}

            def build(which: str) -> Callable[[], None]:
                function = build_dp_schedule if which == "this" else reference
                return lambda: built.__setitem__(which, function(lengths, dp, cap, group_ids=group_ids))

            order = ["this"] if reference is None else ["this", "ref"] if round_index % 2 == 0 else ["ref", "this"]
            seconds = {which: cpu(build(which)) for which in order}
            times[(name, cap)].append((bfd, seconds["this"]))
            results[(name, cap)] = built["this"]
            if reference is not None:
                ref_times[(name, cap)].append(seconds["ref"])
                same[(name, cap)] = all(
                    getattr(built["this"], field) == getattr(built["ref"], field)
                    for field in ("micro_batches", "rank_indices", "num_micro_batches")
                )
    extra = " ref, BFD passes (median) | this / ref (median) | same schedule |" if reference is not None else ""
    rows = [
        "| workload | samples | ranks | cap | micro-batches per rank | step efficiency per micro-batch / per step "
        "| BFD pass ms | build_dp_schedule ms | BFD passes (median) | worst round |" + extra,
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if reference is not None else ""),
    ]
    records = []
    for name, cap, lengths, _ in cases:
        pairs = times[(name, cap)]
        ratios = [plan / bfd for bfd, plan in pairs]
        schedule = results[(name, cap)]
        efficiency = schedule.step_efficiency()
        record = dict(
            workload=name, n=n, dp=dp, cap=cap, count=schedule.num_micro_batches, per_micro_batch=efficiency["per_micro_batch"],
            per_step=efficiency["per_step"], bfd_s=min(b for b, _ in pairs), schedule_s=min(p for _, p in pairs),
            ratio_median=statistics.median(ratios), ratio_worst=max(ratios),
        )
        row = (
            f"| {name} | {n} | {dp} | {cap} | {schedule.num_micro_batches} | {efficiency['per_micro_batch']:.6f} / "
            f"{efficiency['per_step']:.6f} | {1e3 * min(b for b, _ in pairs):.0f} | {1e3 * min(p for _, p in pairs):.0f} "
            f"| {statistics.median(ratios):.1f}x | {max(ratios):.1f}x |"
        )
        if reference is not None:
            reference_s = ref_times[(name, cap)]
            record.update(
                ref_ratio_median=statistics.median(r / b for r, (b, _) in zip(reference_s, pairs)),
                this_over_ref=statistics.median(p / r for r, (_, p) in zip(reference_s, pairs)),
                same_schedule=same[(name, cap)],
            )
            row += (f" {record['ref_ratio_median']:.1f}x | {record['this_over_ref']:.2f} | "
                    f"{'yes' if record['same_schedule'] else 'differs'} |")
        records.append(record)
        rows.append(row)
    if json_path:
        Path(json_path).write_text(json.dumps(records, indent=1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 batches per workload instead of 20")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per global batch (multiple of 64)")
    parser.add_argument("--small-batch", type=int, default=256, help="batch of the second, generated-only table")
    parser.add_argument("--cap", type=int, default=8192, help="max_token_len for generated workloads")
    parser.add_argument("--real-cap", type=int, default=8192, help="max_token_len for the real length lists")
    parser.add_argument("--planning-cost", action="store_true",
                        help="only the planning cost of build_dp_schedule, in plain BFD passes (see above)")
    parser.add_argument("--n", type=int, default=32768, help="--planning-cost: samples in the batch")
    parser.add_argument("--dp", type=int, default=32, help="--planning-cost: ranks")
    parser.add_argument("--caps", type=int, nargs="*", default=[16384, 32768], help="--planning-cost: caps")
    parser.add_argument("--rounds", type=int, default=5, help="--planning-cost: interleaved rounds (median reported)")
    parser.add_argument("--json", help="--planning-cost: also write every row to this JSON file")
    parser.add_argument("--ref", type=Path,
                        help="--planning-cost: another checkout whose build_dp_schedule is timed side by side")
    args = parser.parse_args()
    count = 3 if args.quick else 20
    generated = list(GENERATED)
    caps = {name: args.cap for name in generated}
    caps["GRPO (groups kept)"] = 4 * args.cap  # a whole group must fit: samples clipped to cap / 8
    names = list(generated)
    directory = lengths_dir()
    if directory is None:
        print("real length lists not found: their rows are skipped", file=sys.stderr)
    else:
        real = sorted(p.name for p in directory.glob("*.txt"))
        names += real
        caps.update({name: args.real_cap for name in real})
    if args.planning_cost:
        print(f"<!-- python benchmarks/bench_schedule.py --planning-cost --rounds {args.rounds}: python "
              f"{platform.python_version()}, numpy {np.__version__}, {platform.machine()} -->\n")
        names = planning_cost_names()
        reference = None
        if args.ref is not None:
            from benchmarks.planning_ab import load_reference_module

            reference = load_reference_module(args.ref.resolve(), "schedule").build_dp_schedule
        print("\n".join(planning_cost(names, args.caps, args.n, args.dp, args.rounds, args.json, reference)))
        return
    print(f"<!-- python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"up to {count} batches per workload -->\n")
    print(f"### Micro-batches per rank: global schedule vs per-rank route, batch {args.batch}\n")
    print("\n".join(compare(names, caps, [2, 4, 8], count, args.batch)))
    print(f"\n### Same, smaller batch of {args.small_batch} (fewer micro-batches per rank)\n")
    print("\n".join(compare(generated, caps, [2, 4, 8], count, args.small_batch)))
    print(f"\n### Packers: bins used, batch {args.batch}\n")
    print("\n".join(packers(names, caps, count, args.batch)))


if __name__ == "__main__":
    main()
