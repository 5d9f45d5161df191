"""What each cost model buys: counts against their bounds, padded memory, padded area.

For every family of ``benchmarks/workloads.py`` (and the shipped sample), at each cap, plans
the batch under each cost model and reports:

* ``count`` and its lower bound under that model (``packing_lower_bound`` on the costed
  lengths for the token models; the padded count is exact, so its bound is itself), and the
  overshoot over the bound;
* ``pad/cap``: the largest ``samples x longest`` of any micro-batch over the cap: what a padded
  forward of that micro-batch holds, against the budget (above 1 means the cap does not bound
  a padded forward's memory);
* ``area``: total ``samples x longest`` over all micro-batches / real tokens (the padding a
  padded forward computes on), next to one fully padded batch (``n x longest / tokens``) and a
  length-sorted split (consecutive runs of the sorted batch, each run as long as
  ``samples x longest <= cap`` allows: the natural baseline for padded forwards);
* ``work``: micro-batch workload max/mean on the model's own workload (tokens: sum of
  ``24576 s + s^2``; padded: ``samples x (24576 L + L^2)`` with ``L`` the longest);
* ``ms``: planning time (CPU, median of repeats), and the length-sorted split's for the padded
  model.

Run:  python -m benchmarks.cost_models [--n 1024] [--caps 4096 16384] [--repeats 3] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from seqbal import CostModel, packing_lower_bound, plan_micro_batches
from seqbal.workload import calculate_workload

from .workloads import case_seed, families

MODELS = {
    "tokens": CostModel(),
    "padded": CostModel(padded=True),
    "round_to=64": CostModel(round_to=64),
    "pack_round_to=8": CostModel(pack_round_to=8),
}


def sorted_split(lengths: np.ndarray, cap: int) -> list[list[int]]:
    """The length-sorted baseline: longest first, each run as long as samples x longest fits."""
    order = np.lexsort((np.arange(len(lengths)), -lengths)).tolist()
    parts, position = [], 0
    while position < len(order):
        longest = max(int(lengths[order[position]]), 1)
        size = max(1, cap // longest)
        parts.append(sorted(order[position:position + size]))
        position += size
    return parts


def _padded_area(lengths: np.ndarray, parts: Sequence[Sequence[int]]) -> int:
    return sum(len(p) * int(lengths[list(p)].max()) for p in parts)


def _imbalance(lengths: np.ndarray, parts: Sequence[Sequence[int]], model: CostModel) -> float:
    costed = model.rounded(lengths)
    if model.padded:
        work = [len(p) * int(calculate_workload([int(costed[list(p)].max())])[0]) for p in parts]
    else:
        work = [int(calculate_workload(costed[list(p)]).sum()) for p in parts]
    return max(work) / (sum(work) / len(work))


def _timed(function: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    times, result = [], None
    for _ in range(repeats):
        start = time.process_time()
        result = function()
        times.append(time.process_time() - start)
    return result, statistics.median(times) * 1e3


def measure(name: str, lengths: np.ndarray, cap: int, repeats: int) -> list[dict[str, Any]]:
    tokens = int(lengths.sum())
    rows = []
    baseline, baseline_ms = _timed(lambda: sorted_split(lengths, cap), repeats)
    for label, model in MODELS.items():
        parts, ms = _timed(lambda: plan_micro_batches(lengths, cap, cost_model=model), repeats)
        if model.padded:
            bound = len(baseline)  # the length-sorted greedy count is the exact padded minimum
        else:
            bound = packing_lower_bound(model.rounded(lengths), model.token_capacity(cap))
        rows.append({
            "family": name, "cap": cap, "model": label, "count": len(parts), "bound": bound,
            "overshoot": len(parts) / bound - 1,
            "pad_over_cap": max(len(p) * int(lengths[p].max()) for p in parts) / cap,
            "area": _padded_area(lengths, parts) / tokens,
            "full_batch_area": len(lengths) * int(lengths.max()) / tokens,
            "sorted_area": _padded_area(lengths, baseline) / tokens,
            "work": _imbalance(lengths, parts, model),
            "sorted_work": _imbalance(lengths, baseline, CostModel(padded=True)) if model.padded else None,
            "ms": ms,
            "sorted_ms": baseline_ms if model.padded else None,
        })
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--caps", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    rows = []
    for cap in args.caps:
        for name, generate in families().items():
            if name.startswith("adv_"):
                continue
            lengths, _ = generate(args.n, cap, case_seed(name, args.n, cap))
            rows += measure(name, np.asarray(lengths, dtype=np.int64), cap, args.repeats)
    header = ("family", "cap", "model", "count", "bound", "over", "pad/cap", "area", "full", "sorted",
              "work", "sorted work", "ms", "sorted ms")
    lines = []
    for r in rows:
        lines.append((r["family"], str(r["cap"]), r["model"], str(r["count"]), str(r["bound"]),
                      f"{r['overshoot']:.1%}", f"{r['pad_over_cap']:.2f}", f"{r['area']:.2f}",
                      f"{r['full_batch_area']:.2f}", f"{r['sorted_area']:.2f}", f"{r['work']:.3f}",
                      "" if r["sorted_work"] is None else f"{r['sorted_work']:.3f}", f"{r['ms']:.1f}",
                      "" if r["sorted_ms"] is None else f"{r['sorted_ms']:.1f}"))
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(x) for x in column) for column in zip(header, *lines)]
    for line in [header, *lines]:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))


if __name__ == "__main__":
    main()
