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

Run from the repository root::

    python benchmarks/bench_schedule.py            # prints the Markdown tables
    python benchmarks/bench_schedule.py --quick    # fewer batches, for a smoke run

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 batches per workload instead of 20")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per global batch (multiple of 64)")
    parser.add_argument("--small-batch", type=int, default=256, help="batch of the second, generated-only table")
    parser.add_argument("--cap", type=int, default=8192, help="max_token_len for generated workloads")
    parser.add_argument("--real-cap", type=int, default=8192, help="max_token_len for the real length lists")
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
