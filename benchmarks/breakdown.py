"""Where the time of one ``rearrange_micro_batches`` call goes, part by part (CPU time).

    python -m benchmarks.breakdown                      # lognormal, n=4096, caps 4096/16384/32768

The call is three things: effective lengths from the mask, the plan, and one TensorDict per
micro-batch. This script times each on the benchmark's batch (a boolean 2-D mask) and two
alternatives a caller or a later change could use: an int64 mask, and one gather of the whole
batch in plan order followed by ``split`` instead of one indexing per micro-batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import run, workloads  # noqa: E402
from seqbal import plan_micro_batches  # noqa: E402
from seqbal.rearrange import effective_lengths  # noqa: E402


def cpu_ms(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) * 1e3)
    return statistics.median(times)


def breakdown(family: str, n: int, cap: int) -> dict:
    lengths, group = workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))
    batch = run.make_batch(lengths)
    mask = batch["attention_mask"]
    parts = plan_micro_batches(lengths, cap, force_group_size=group)
    order = torch.as_tensor([i for p in parts for i in p])
    sizes = [len(p) for p in parts]
    mask64 = mask.long()
    return {
        "micro-batches": len(parts),
        "mask": f"{tuple(mask.shape)} bool",
        "lengths from bool mask": cpu_ms(lambda: effective_lengths(batch)),
        "lengths from int64 mask": cpu_ms(lambda: mask64.sum(-1)),
        "plan": cpu_ms(lambda: plan_micro_batches(lengths, cap, force_group_size=group)),
        "index per micro-batch": cpu_ms(lambda: [batch[torch.as_tensor(p)] for p in parts]),
        "gather once + split": cpu_ms(lambda: batch[order].split(sizes)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="lognormal")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--caps", nargs="*", type=int, default=[4096, 16384, 32768])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for cap in args.caps:
        result = breakdown(args.family, args.n, cap)
        print(f"{args.family}, n={args.n}, cap={cap}: "
              + ", ".join(f"{k} {v:.1f} ms" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
