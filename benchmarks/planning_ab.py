"""Plan CPU time of this tree against another tree's, both in one process, plans compared.

    python -m benchmarks.planning_ab --ref /path/to/other/checkout                 # n = 64/256/512, every family and cap
    python -m benchmarks.planning_ab --ref ../main --cases uniform:64:4096 bimodal_rl:256:32768 --rounds 15
    python -m benchmarks.planning_ab --ref <checkout> --workload-fn default     # this tree given a workload_fn

The planning-cost ratio (:mod:`benchmarks.planning_cost`) divides by one best-fit-decreasing
pass, and at 64 samples that pass costs 0.12 to 0.38 ms from one run to the next on a shared
machine (its cost is mostly fixed per call), so the ratio of two trees measured in two runs
moves by more than most changes to the plan. Here the other tree's ``seqbal`` is copied under
another name (``seqbal_ref``, its relative imports unchanged) and imported next to this one,
and each case times both plans in turn, in CPU time (``time.process_time``), after a garbage
collection, for ``--rounds`` rounds: the median of the per-round ratios (this / ref) is what a
change did, on the same machine state. Every case checks first that both trees return the
same plan (a change that alters plans shows as ``differs``). The best-fit-decreasing pass is
timed in the same rounds, for the plan's cost in passes (warm: the calls repeat, so caches and
branch predictors are warm and the passes read higher than the harness's cold single calls).

``--workload-fn`` gives this tree's plan a ``workload_fn`` (the reference plans on its default):
``default`` passes :func:`seqbal.calculate_workload` itself (the same plans, so what passing a
model costs), ``fitted`` a float time model ``fixed + per token + per token squared`` (other
plans: what balancing a measured cost costs).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402
from seqbal import best_fit_decreasing_partitions, calculate_workload, plan_micro_batches  # noqa: E402


def _fitted(lengths):
    """A time model of the kind a calibration fits (microseconds): fixed, per token, per token squared."""
    return 150.0 + 0.9 * lengths + 2.5e-5 * lengths * lengths


#: What ``--workload-fn`` passes to this tree's plan.
WORKLOAD_FNS = {"none": None, "default": calculate_workload, "fitted": _fitted}


def load_reference_module(tree: Path, module: str):
    """``seqbal.<module>`` of the checkout at ``tree``, its package imported as ``seqbal_ref``
    (copied once per process)."""
    if "seqbal_ref" not in sys.modules:
        folder = Path(tempfile.mkdtemp(prefix="seqbal-ab-"))
        shutil.copytree(tree / "seqbal", folder / "seqbal_ref", ignore=shutil.ignore_patterns("__pycache__"))
        sys.path.insert(0, str(folder))
    return importlib.import_module(f"seqbal_ref.{module}")


def load_reference(tree: Path):
    """``plan_micro_batches`` of the checkout at ``tree``, imported as ``seqbal_ref``."""
    return load_reference_module(tree, "plan.entry").plan_micro_batches


def cpu_seconds(fn, reps: int) -> float:
    gc.collect()
    start = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - start) / reps


def measure(family: str, n: int, cap: int, reference, rounds: int, workload_fn=None) -> dict:
    lengths, group = workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))
    extra = {} if workload_fn is None else {"workload_fn": workload_fn}
    this = lambda: plan_micro_batches(lengths, cap, force_group_size=group, **extra)  # noqa: E731
    ref = lambda: reference(lengths, cap, force_group_size=group)  # noqa: E731
    same = this() == ref()
    reps = max(3, int(0.02 / max(cpu_seconds(ref, 3), 1e-5)))  # about 20 ms a timing
    ratios, passes = [], []
    for _ in range(rounds):
        t_ref, t_this = cpu_seconds(ref, reps), cpu_seconds(this, reps)
        t_bfd = cpu_seconds(lambda: best_fit_decreasing_partitions(lengths, cap), reps)
        ratios.append(t_this / t_ref)
        passes.append((t_ref / t_bfd, t_this / t_bfd))
    return {"family": family, "n": n, "cap": cap, "same": same, "ratio": statistics.median(ratios),
            "ref_passes": statistics.median(p[0] for p in passes), "passes": statistics.median(p[1] for p in passes)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, type=Path, help="a checkout of the tree to compare with")
    parser.add_argument("--cases", nargs="*", help="family:n:cap (default: every family at --sizes and --caps)")
    parser.add_argument("--sizes", nargs="*", type=int, default=[64, 256, 512])
    parser.add_argument("--caps", nargs="*", type=int, default=[4096, 16384, 32768])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--workload-fn", choices=sorted(WORKLOAD_FNS), default="none",
                        help="the workload_fn this tree's plan is given (the reference's plans on its default)")
    args = parser.parse_args(argv)
    reference = load_reference(args.ref.resolve())
    cases = ([(f, int(n), int(c)) for f, n, c in (case.split(":") for case in args.cases)] if args.cases
             else [(f, n, c) for f in workloads.families() for n in args.sizes for c in args.caps])
    rows = []
    for family, n, cap in cases:
        row = measure(family, n, cap, reference, args.rounds, WORKLOAD_FNS[args.workload_fn])
        rows.append(row)
        print(f"{family:>20} n={n:>6} cap={cap:>6}  this/ref {row['ratio']:.3f}  passes (warm) ref {row['ref_passes']:5.2f} "
              f"this {row['passes']:5.2f}  {'same plan' if row['same'] else 'differs'}", flush=True)
    ratios = [row["ratio"] for row in rows]
    print(f"{len(rows)} cases: this/ref median {statistics.median(ratios):.3f}, best {min(ratios):.3f}, "
          f"worst {max(ratios):.3f}; plans differ in {sum(not row['same'] for row in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
