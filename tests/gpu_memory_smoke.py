"""Memory calibration on a real device (run by tests/gpu_smoke.sh; ``--cpu`` in the CPU suite).

For each attention kind (eager: quadratic; SDPA: fused, linear), a small causal transformer
(``benchmarks/tiny_lm.py``; on CUDA hidden 1024, 4 layers, vocabulary 32768) is calibrated
against a budget of a few GB with :func:`seqbal.memory.calibrate` on synthetic probes. Then a
batch drawn from the shipped Qwen2.5-Math rollout lengths is planned against predicted bytes
and against the calibrated token cap, and the heaviest micro-batches of each plan are run and
metered (``torch.cuda.max_memory_allocated`` on CUDA):

1. **prediction**: every metered micro-batch within ``--tolerance`` (default 10%) of its
   prediction; median and worst printed;
2. **budget**: no metered micro-batch peaks above the budget.

Usage: ``python tests/gpu_memory_smoke.py`` (CUDA, budget 4096 MiB) or ``--cpu`` (the small
model, 128 MiB of the step's own allocations, seconds). Prints ``PASS``/``FAIL`` lines and
exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the small model on the CPU (the suite's variant)")
    parser.add_argument("--budget-mib", type=int, default=None, help="default 4096 on CUDA, 128 on the CPU")
    parser.add_argument("--samples", type=int, default=None, help="lengths drawn (default 256 on CUDA, 24 on the CPU)")
    parser.add_argument("--per-plan", type=int, default=None, help="heaviest micro-batches metered per plan (default 4, CPU 2)")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args(argv)
    import numpy as np
    import torch

    from benchmarks.memory import SHIPPED, run_kind, summary

    if args.cpu:
        device, large = "cpu", False
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            print("FAIL memory calibration: no CUDA device (use --cpu for the CPU variant)")
            return 1
        device, large = "cuda", True
    budget = (args.budget_mib or (128 if args.cpu else 4096)) << 20
    samples = args.samples or (24 if args.cpu else 256)
    per_plan = args.per_plan or (2 if args.cpu else 4)
    lists = {"qwen_rollouts": np.loadtxt(SHIPPED, dtype=np.int64, ndmin=1)}
    failed = False
    for kind in ("eager", "sdpa"):
        result = run_kind(kind, budget, device, lists, samples, seed=0, large=large, per_plan=per_plan)
        s = summary(result)
        line = (f"{kind} on {device}: {s['metered']} micro-batches, prediction error median {s['median_error']:.1%} "
                f"worst {s['worst_error']:.1%}; largest peak {s['max_peak_over_budget']:.3f} of the budget "
                f"{budget >> 20} MiB; {result.counts}")
        ok_prediction = s["worst_error"] <= args.tolerance
        ok_budget = s["over_budget"] == 0
        print(f"{'PASS' if ok_prediction else 'FAIL'} memory prediction within {args.tolerance:.0%}: {line}")
        print(f"{'PASS' if ok_budget else 'FAIL'} memory planned under the budget: {line}")
        failed |= not (ok_prediction and ok_budget)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
