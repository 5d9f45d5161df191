"""Planning time and memory at dataset scale: 65,536 to 10^7 samples (docs/benchmarks.md).

    python -m benchmarks.scale                                   # every family, n 65536 / 10^6 / 10^7, cap 4096
    python -m benchmarks.scale --sizes 65536 1000000 --caps 4096 32768 --out after.json
    python -m benchmarks.scale --families real_qwen_rollouts near_third --sizes 1000000
    python -m benchmarks.scale --compare before.json             # counts must not rise against a record
    python -m benchmarks.scale --growth after.json               # per-sample growth 65,536 -> 10^6
    python -m benchmarks.scale --sizes 65536 1000000 --interleave 3   # sizes in turn in one process, medians

Each (family, cap, n) runs in a fresh subprocess so its peak resident memory (``ru_maxrss``,
above the interpreter's baseline after importing NumPy and seqbal and building the lengths) is
its own. A row gives the CPU time (``time.process_time``) of one ``plan_micro_batches`` call,
its cost per sample, the count against the packing lower bound, one best-fit-decreasing pass
on the same lengths (the yardstick; skipped from ``--bfd-max`` samples on, where the pass
itself is quadratic in memmoves) and the peak memory. CPU times on a shared machine are
noisy: compare rows of one run, or runs made side by side, as ratios; ``--interleave R``
plans a (family, cap)'s sizes in turn in one process, R rounds, and keeps each size's median,
so that a load on the machine weighs on every size alike (the growth figures of
docs/benchmarks.md).

Families: those of ``benchmarks/workloads.py`` (the real lists drawn with replacement past
their size) and ``near_third`` (uniform on [1160, 1570) at cap 4096, scaled to the cap: two or
three share a micro-batch and the count search repairs many tries, the shape that once took minutes).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
SIZES = (65536, 1_000_000, 10_000_000)


def lengths_near_a_third(n: int, cap: int, seed: int = 13):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(cap * 1160 // 4096, cap * 1570 // 4096, n).astype(np.int64)


def family_names() -> list[str]:
    from benchmarks import workloads

    return list(workloads.families()) + ["near_third"]


def generate(family: str, n: int, cap: int):
    from benchmarks import workloads

    if family == "near_third":
        return lengths_near_a_third(n, cap), 1
    return workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))


def one(family: str, n: int, cap: int, bfd_max: int) -> dict:
    """Runs in the child: plan once, return the figures."""
    from seqbal import best_fit_decreasing_partitions, packing_lower_bound, plan_micro_batches

    lengths, group = generate(family, n, cap)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    parts = plan_micro_batches(lengths, cap, force_group_size=group)
    plan = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    bfd = None
    if n < bfd_max:
        start = time.process_time()
        best_fit_decreasing_partitions(lengths, cap)
        bfd = time.process_time() - start
    sums = [int(lengths[p].sum()) for p in parts]
    assert max(sums) <= cap and sum(map(len, parts)) == n
    return {"family": family, "n": n, "cap": cap, "count": len(parts), "bound": packing_lower_bound(lengths, cap),
            "plan_s": plan, "us_per_sample": plan / n * 1e6, "bfd_s": bfd, "peak_mb": (peak - baseline) / 1024}


def interleaved(family: str, sizes: list[int], cap: int, rounds: int, bfd_max: int) -> list[dict]:
    """Runs in the child: the sizes planned in turn, ``rounds`` times, in one process, so that
    a load on the machine weighs on every size alike; the median CPU time per size. The peak
    memory is the whole child's (the largest size's), given on the largest size's row."""
    import statistics

    from seqbal import best_fit_decreasing_partitions, packing_lower_bound, plan_micro_batches

    cases = {n: generate(family, n, cap) for n in sizes}
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times: dict[int, list[float]] = {n: [] for n in sizes}
    passes: dict[int, list[float]] = {n: [] for n in sizes}
    counts: dict[int, int] = {}
    for _ in range(rounds):
        for n in sizes:
            lengths, group = cases[n]
            start = time.process_time()
            parts = plan_micro_batches(lengths, cap, force_group_size=group)
            times[n].append(time.process_time() - start)
            counts[n] = len(parts)
            del parts
            if n < bfd_max:
                start = time.process_time()
                best_fit_decreasing_partitions(lengths, cap)
                passes[n].append(time.process_time() - start)
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline) / 1024
    rows = []
    for n in sizes:
        plan = statistics.median(times[n])
        rows.append({"family": family, "n": n, "cap": cap, "count": counts[n],
                     "bound": packing_lower_bound(cases[n][0], cap), "plan_s": plan, "us_per_sample": plan / n * 1e6,
                     "bfd_s": statistics.median(passes[n]) if passes[n] else None,
                     "peak_mb": peak if n == max(sizes) else float("nan"), "rounds": rounds})
    return rows


def row(r: dict) -> str:
    bfd = "-" if r["bfd_s"] is None else f"{r['bfd_s']:.2f}"
    passes = "-" if r["bfd_s"] is None else f"{r['plan_s'] / max(r['bfd_s'], 1e-6):.1f}"
    return (f"| {r['family']} | {r['cap']} | {r['n']:,} | {r['count']:,} | {r['bound']:,} | "
            f"{(r['count'] - r['bound']) / max(r['bound'], 1):.3%} | {r['plan_s']:.2f} | {r['us_per_sample']:.1f} | "
            f"{bfd} | {passes} | {'-' if r['peak_mb'] != r['peak_mb'] else format(r['peak_mb'], '.0f')} |")


HEADER = ("| family | cap | n | count | lower bound | above bound | plan CPU s | us / sample | BFD pass CPU s | "
          "BFD passes | peak MB |\n|---|---|---|---|---|---|---|---|---|---|---|")


def growth(rows: list[dict], low: int = 65536, high: int = 1_000_000) -> list[str]:
    """Per (family, cap): us/sample at ``high`` over that at ``low``."""
    by = {(r["family"], r["cap"], r["n"]): r for r in rows}
    out = ["| family | cap | us/sample at 65,536 | at 10^6 | growth | 10^6 in BFD passes |", "|---|---|---|---|---|---|"]
    for (family, cap, n), r in sorted(by.items()):
        if n != high or (family, cap, low) not in by:
            continue
        a = by[(family, cap, low)]
        passes = "-" if r["bfd_s"] is None else f"{r['plan_s'] / max(r['bfd_s'], 1e-6):.1f}"
        out.append(f"| {family} | {cap} | {a['us_per_sample']:.1f} | {r['us_per_sample']:.1f} | "
                   f"{r['us_per_sample'] / a['us_per_sample']:.2f}x | {passes} |")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", type=int, default=list(SIZES))
    parser.add_argument("--caps", nargs="*", type=int, default=[4096])
    parser.add_argument("--families", nargs="*", default=None, help="default: every family")
    parser.add_argument("--bfd-max", type=int, default=2_000_000, help="skip the BFD yardstick from this n on")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    parser.add_argument("--compare", type=Path, default=None, help="a record: exit 1 if a count rose")
    parser.add_argument("--growth", type=Path, default=None, help="print the growth table of a record and exit")
    parser.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                        help="plan the sizes of a (family, cap) in turn in one process, ROUNDS times (medians)")
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None and args.interleave:
        family, sizes, cap = args.child
        print(json.dumps(interleaved(family, [int(n) for n in sizes.split(",")], int(cap), args.interleave, args.bfd_max)))
        return 0
    if args.child is not None:
        family, n, cap = args.child
        print(json.dumps(one(family, int(n), int(cap), args.bfd_max)))
        return 0
    if args.growth is not None:
        print("\n".join(growth(json.loads(args.growth.read_text()))))
        return 0
    record = {}
    if args.compare is not None:
        record = {(r["family"], r["cap"], r["n"]): r for r in json.loads(args.compare.read_text())}
    rows, risen = [], []
    print(HEADER, flush=True)
    for family in args.families or family_names():
        for cap in args.caps:
            if args.interleave:
                runs = [[sys.executable, "-m", "benchmarks.scale", "--bfd-max", str(args.bfd_max), "--interleave",
                         str(args.interleave), "--child", family, ",".join(map(str, args.sizes)), str(cap)]]
            else:
                runs = [[sys.executable, "-m", "benchmarks.scale", "--bfd-max", str(args.bfd_max), "--child", family,
                         str(n), str(cap)] for n in args.sizes]
            for command in runs:
                out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
                result = json.loads(out.strip().splitlines()[-1])
                for r in result if isinstance(result, list) else [result]:
                    rows.append(r)
                    old = record.get((family, cap, r["n"]))
                    note = ""
                    if old is not None and r["count"] > old["count"]:
                        risen.append(r)
                        note = f" ROSE from {old['count']:,}"
                    print(row(r) + note, flush=True)
                if args.out is not None:
                    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    if len({r["n"] for r in rows}) > 1:
        print()
        print("\n".join(growth(rows)))
    if args.compare is not None:
        print(f"{len(risen)} count(s) above the record")
        return 1 if risen else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
