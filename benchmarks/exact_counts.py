"""How often the count is above the exact optimum, on small random inputs.

    python -m benchmarks.exact_counts                   # 110,000 inputs, about 3-4 minutes
    python -m benchmarks.exact_counts --cases 20000 --seed 1
    python -m benchmarks.exact_counts --divided-by 2     # plan_micro_batches(..., num_batches_divided_by=2)

Inputs: 1 to 9 items, a cap drawn from 10..100; half the inputs draw items from 1..L for a
random L <= cap, half from just over L/2 up to the cap (many items over a third of the cap,
the hard shape). The count is ``smallest_feasible_partitions`` on the default workloads; the
optimum is an exhaustive search (``tests/exact_packing.py``), run only where the count is
above the lower bound (where it equals the bound it is optimal). With ``--divided-by D`` the
count is ``plan_micro_batches(..., num_batches_divided_by=D)`` and the optimum the exact one
rounded up to a multiple of D (inputs with fewer items than that are left out: they raise).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seqbal import calculate_workload, packing_lower_bound, plan_micro_batches  # noqa: E402
from seqbal.partition import smallest_feasible_partitions  # noqa: E402
from tests.exact_packing import optimal_bin_count  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=110_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--divided-by", type=int, default=None, help="num_batches_divided_by of plan_micro_batches")
    args = parser.parse_args(argv)
    step = args.divided_by or 1
    rng = np.random.default_rng(args.seed)
    above = []
    for _ in range(args.cases):
        n, cap = int(rng.integers(1, 10)), int(rng.integers(10, 101))
        low = int(rng.integers(1, cap + 1))
        lengths = rng.integers(1, low + 1, n) if rng.random() < 0.5 else rng.integers(low // 2 + 1, cap + 1, n)
        bound = -(-packing_lower_bound(lengths, cap) // step) * step
        if args.divided_by is None:
            count, _ = smallest_feasible_partitions(lengths, calculate_workload(lengths), cap)
        elif bound > n:
            continue  # no multiple of the divisor fits in n items: an error, not a count
        else:
            try:
                count = len(plan_micro_batches(lengths, cap, num_batches_divided_by=step))
            except ValueError:
                count = n + 1  # the plan gave up below a count that exists (counted if the optimum fits)
        if count == bound:
            continue
        optimum = -(-optimal_bin_count(lengths.tolist(), cap) // step) * step
        if optimum > n:
            continue
        if count != optimum:
            above.append((lengths.tolist(), cap, count, optimum))
    divided = f", num_batches_divided_by={step}" if args.divided_by else ""
    print(f"above the exact optimum on {len(above)} of {args.cases} inputs (seed {args.seed}{divided})")
    for lengths, cap, count, optimum in above:
        print(f"  {lengths} cap {cap}: {count} micro-batches, optimum {optimum}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
