"""Planning cost as a ratio to one best-fit-decreasing pass, with the count and imbalance.

    python -m benchmarks.planning_cost                          # grid: every family, n 4096/16384, caps 4096/16384/32768
    python -m benchmarks.planning_cost --sizes 64 256 1024      # other sizes
    python -m benchmarks.planning_cost --out before.json        # keep the rows (count, imbalance, ratio)
    python -m benchmarks.planning_cost --compare before.json    # check counts and imbalance against a record
    python -m benchmarks.planning_cost --table before.json after.json   # Markdown before/after table
    python -m benchmarks.planning_cost --sizes 64 256 512 --by-family   # worst case per family and size

For every case the plan and one :func:`seqbal.best_fit_decreasing_partitions` pass on the
same lengths run side by side in one process and are timed in CPU time
(``time.process_time``), so the ratio holds on a loaded machine where wall times do not.
A case's ratio is the median of ``--repeats`` alternating measurements (plan / BFD of the
same round); the worst of them is kept too (``ratio_max``), since one slow BFD pass on a
shared machine can double a single round's ratio. The target is about the worst *case*:
the summary line names the case with the highest median ratio.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402
from seqbal import best_fit_decreasing_partitions, micro_batch_summary, plan_micro_batches  # noqa: E402


def cpu_ms(fn) -> tuple[float, object]:
    gc.collect()  # every timed call starts from the same collector state
    start = time.process_time()
    result = fn()
    return (time.process_time() - start) * 1e3, result


def measure(family: str, n: int, cap: int, repeats: int) -> dict:
    lengths, group = workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))
    ratios, plans, passes = [], [], []
    parts = None
    for _ in range(repeats):
        bfd, _ = cpu_ms(lambda: best_fit_decreasing_partitions(lengths, cap))  # the same lengths, as the issue
        plan, parts = cpu_ms(lambda: plan_micro_batches(lengths, cap, force_group_size=group))
        plans.append(plan)
        passes.append(bfd)
        ratios.append(plan / max(bfd, 1e-3))
    summary = micro_batch_summary(lengths, parts, cap)
    return {
        "family": family, "n": n, "cap": cap, "count": summary["count"],
        "imbalance": summary["workload_imbalance"], "plan_cpu_ms": min(plans), "bfd_cpu_ms": min(passes),
        "ratio": float(np.median(ratios)), "ratio_max": max(ratios),
    }


def table(before: list, after: list) -> str:
    """Markdown: one row per case of ``after`` that ``before`` also has."""
    old = {(r["family"], r["n"], r["cap"]): r for r in before}
    lines = ["| family | n | cap | count before / after | imbalance before / after | plan / BFD before | plan / BFD after |",
             "|---|---|---|---|---|---|---|"]
    for r in after:
        b = old.get((r["family"], r["n"], r["cap"]))
        if b is None:
            continue
        lines.append(f"| {r['family']} | {r['n']} | {r['cap']} | {b['count']} / {r['count']} | "
                     f"{b['imbalance']:.4f} / {r['imbalance']:.4f} | {b['ratio']:.1f}x | {r['ratio']:.1f}x |")
    return "\n".join(lines)


def family_table(rows: list) -> str:
    """Markdown: per family, the worst median ratio over the caps at each size (with its cap)."""
    sizes = sorted({r["n"] for r in rows})
    lines = ["| family | " + " | ".join(f"n = {n}: worst plan / BFD (cap)" for n in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for family in dict.fromkeys(r["family"] for r in rows):
        cells = []
        for n in sizes:
            worst = max((r for r in rows if r["family"] == family and r["n"] == n), key=lambda r: r["ratio"])
            cells.append(f"{worst['ratio']:.1f}x ({worst['cap']})")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=None)
    parser.add_argument("--sizes", nargs="*", type=int, default=[4096, 16384])
    parser.add_argument("--caps", nargs="*", type=int, default=[4096, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--compare", type=Path, default=None, help="a JSON record from --out to compare with")
    parser.add_argument("--table", type=Path, nargs=2, default=None, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--by-family", action="store_true", help="print the worst case per family and size")
    args = parser.parse_args(argv)
    if args.table:
        print(table(*(json.loads(path.read_text()) for path in args.table)))
        return 0
    names = args.families or list(workloads.families())
    before = {}
    if args.compare:
        before = {(r["family"], r["n"], r["cap"]): r for r in json.loads(args.compare.read_text())}
    rows = []
    for family in names:
        for n in args.sizes:
            for cap in args.caps:
                row = measure(family, n, cap, args.repeats)
                rows.append(row)
                old = before.get((family, n, cap))
                extra = ""
                if old:
                    extra = (f"  before: count {old['count']} imbalance {old['imbalance']:.4f} ratio {old['ratio']:.1f}x"
                             f"{'  COUNT UP' if row['count'] > old['count'] else ''}"
                             f"{'  IMBALANCE +2%' if row['imbalance'] > old['imbalance'] * 1.02 else ''}")
                print(f"{family:>20} n={n:>6} cap={cap:>6} count={row['count']:>6} imb={row['imbalance']:.4f} "
                      f"plan={row['plan_cpu_ms']:9.1f}ms bfd={row['bfd_cpu_ms']:7.1f}ms ratio={row['ratio']:6.1f}x "
                      f"(worst round {row['ratio_max']:5.1f}x){extra}", flush=True)
    worst = max(rows, key=lambda r: r["ratio"])
    print(f"worst case: median ratio {worst['ratio']:.1f}x, worst round {worst['ratio_max']:.1f}x "
          f"({worst['family']}, n={worst['n']}, cap={worst['cap']}); "
          f"highest single round {max(r['ratio_max'] for r in rows):.1f}x")
    if args.by_family:
        print(family_table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
