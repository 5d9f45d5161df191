"""Planning time and memory at scale: lengths near a third of the cap (issue 13, point 13).

    python -m benchmarks.scale                       # n = 16384, 65536, 262144 at cap 4096
    python -m benchmarks.scale --sizes 1048576       # other sizes

Each size runs in a fresh subprocess so its peak resident memory (``ru_maxrss``) is its own;
the table gives the CPU time of one ``plan_micro_batches`` call, one best-fit-decreasing pass
on the same lengths (the O(n log n) yardstick), the count against the lower bound, and the
peak memory above the interpreter's baseline after importing NumPy and seqbal.
Lengths: uniform on [1160, 1570) at cap 4096 (scaled for other caps), so two or three share
a micro-batch, the bound is well below the packing and the count search has to repair many
tries (the shape that made every repair step sort all the bins: 369 s and 719 MB at 262,144
samples before).
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


def lengths_near_a_third(n: int, cap: int, seed: int = 13):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(cap * 1160 // 4096, cap * 1570 // 4096, n).astype(np.int64)


def one(n: int, cap: int) -> dict:
    """Runs in the child: plan once, return the figures."""
    import numpy as np  # noqa: F401

    from seqbal import best_fit_decreasing_partitions, packing_lower_bound, plan_micro_batches

    lengths = lengths_near_a_third(n, cap)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    parts = plan_micro_batches(lengths, cap)
    plan = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    best_fit_decreasing_partitions(lengths, cap)
    bfd = time.process_time() - start
    assert max(int(lengths[p].sum()) for p in parts) <= cap
    return {"n": n, "cap": cap, "count": len(parts), "bound": packing_lower_bound(lengths, cap),
            "plan_s": plan, "bfd_s": bfd, "peak_mb": (peak - baseline) / 1024}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", type=int, default=[16384, 65536, 262144])
    parser.add_argument("--cap", type=int, default=4096)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(one(args.child, args.cap)))
        return 0
    print("| n | cap | count | lower bound | plan CPU s | BFD pass CPU s | plan / BFD | peak memory MB |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        out = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--child", str(n), "--cap", str(args.cap)],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {r['n']} | {r['cap']} | {r['count']} | {r['bound']} | {r['plan_s']:.2f} | {r['bfd_s']:.2f} | "
              f"{r['plan_s'] / max(r['bfd_s'], 1e-6):.1f}x | {r['peak_mb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
