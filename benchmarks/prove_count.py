"""Whether a benchmark case's lengths fit in a given number of micro-batches: an exact answer.

    python -m benchmarks.prove_count uniform 64 4096 30                # one planning-cost case
    python -m benchmarks.prove_count uniform 64 4096 30 --time-limit 60 --workers 2

The count search's tries are heuristics: where a try fails at a count that no lower bound
rules out, the plan pays for the try and nobody knows whether the count was possible. The small-plan
target (docs/benchmarks_method.md) lets a small plan keep such a cost where it is the price of a count that is in fact infeasible,
named with its proof in docs/benchmarks_method.md. This script is that proof: it hands the
case (the ``benchmarks.planning_cost`` lengths, forced groups summed) to the CP-SAT solver of
Google OR-Tools as a 0/1 model (every item in exactly one of ``count`` micro-batches, every
micro-batch within the cap) and prints ``INFEASIBLE`` (proved), ``FEASIBLE`` (with a witness
checked here, item by item), or ``UNKNOWN`` (the time limit ran out).

One symmetry is broken, which keeps the answer exact: items above half the cap can never share
a micro-batch, and the micro-batches are interchangeable, so the j-th largest of them is put in
micro-batch j (more such items than micro-batches is infeasible at once).

OR-Tools is not a dependency of seqbal (``pip install ortools``, or the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402


def case_items(family: str, n: int, cap: int) -> list[int]:
    """The tokens of the case's packing items: its lengths, or the sums of its forced groups."""
    lengths, group = workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))
    lengths = np.asarray(lengths, dtype=np.int64)
    return lengths.reshape(-1, group).sum(axis=1).tolist()


def fits_in(items: list[int], cap: int, count: int, time_limit: float = 60.0, workers: int = 1) -> tuple[str, list[int] | None]:
    """``("INFEASIBLE" | "FEASIBLE" | "UNKNOWN", the micro-batch of each item or None)`` for
    packing ``items`` (tokens) into ``count`` micro-batches of at most ``cap`` tokens."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise SystemExit("benchmarks.prove_count needs OR-Tools: pip install ortools") from error
    if count < 1 or any(size > cap for size in items):
        return "INFEASIBLE", None
    order = sorted(range(len(items)), key=lambda i: -items[i])
    large = [i for i in order if 2 * items[i] > cap]
    if len(large) > count:
        return "INFEASIBLE", None
    model = cp_model.CpModel()
    place = {(i, b): model.NewBoolVar(f"x{i}_{b}") for i in range(len(items)) for b in range(count)}
    for i in range(len(items)):
        model.AddExactlyOne(place[i, b] for b in range(count))
    for b in range(count):
        model.Add(sum(items[i] * place[i, b] for i in range(len(items))) <= cap)
    for b, i in enumerate(large):  # pairwise incompatible: one per micro-batch, in order
        model.Add(place[i, b] == 1)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    status = solver.Solve(model)
    if status == cp_model.INFEASIBLE:
        return "INFEASIBLE", None
    if status not in (cp_model.FEASIBLE, cp_model.OPTIMAL):
        return "UNKNOWN", None
    where = [next(b for b in range(count) if solver.Value(place[i, b])) for i in range(len(items))]
    loads = np.bincount(where, weights=items, minlength=count)
    if loads.max() > cap:  # the witness is checked here, not taken on trust
        raise RuntimeError(f"the solver's packing puts {int(loads.max())} tokens in a micro-batch (cap {cap})")
    return "FEASIBLE", where


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", choices=sorted(workloads.families()))
    parser.add_argument("n", type=int, help="samples in the case")
    parser.add_argument("cap", type=int, help="max_token_len")
    parser.add_argument("count", type=int, help="micro-batches to fit the samples in")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds the solver may take")
    parser.add_argument("--workers", type=int, default=1, help="solver threads")
    args = parser.parse_args(argv)
    items = case_items(args.family, args.n, args.cap)
    start = time.perf_counter()
    status, _ = fits_in(items, args.cap, args.count, args.time_limit, args.workers)
    seconds = time.perf_counter() - start
    total = sum(items)
    print(f"{args.family} {args.n} / cap {args.cap}: {len(items)} items, {total} tokens "
          f"(ceil(total / cap) = {-(-total // args.cap)}), {sum(2 * s > args.cap for s in items)} above half the cap; "
          f"{args.count} micro-batches: {status} ({seconds:.1f} s, {args.workers} worker(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
