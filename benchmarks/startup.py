"""Start-up cost of the planning entry points: wall time, peak RSS and ``python -X importtime``.

    python -m benchmarks.startup                              # this checkout
    python -m benchmarks.startup --before /tmp/before         # side by side with another checkout

Measures, in fresh processes, ``seqbal plan --help`` (as ``python -m seqbal plan --help``) and
``python -c "import seqbal; seqbal.plan_micro_batches([1, 2], 4)"``. With ``--before`` the two
checkouts run alternately, so a busy machine slows both alike; read the ratio, not the seconds.
Peak RSS comes from ``/usr/bin/time -f %M`` (GNU time), when it is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "seqbal plan --help": ["-m", "seqbal", "plan", "--help"],
    "import + plan_micro_batches": ["-c", "import seqbal; seqbal.plan_micro_batches([1, 2], 4)"],
}
GNU_TIME = Path("/usr/bin/time").exists()


def _run(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB or NaN) of one fresh process in ``tree``."""
    command = [sys.executable, *args]
    if GNU_TIME:
        command = ["/usr/bin/time", "-f", "%M", *command]
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    rss = int(done.stderr.strip().splitlines()[-1]) / 1024 if GNU_TIME else float("nan")
    return wall, rss


def _import_time(tree: Path) -> tuple[float, list[tuple[str, float]]]:
    """Sum of the top-level cumulative import times (ms), and the largest top-level imports."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-X", "importtime", *CASES["import + plan_micro_batches"]],
                          cwd=tree, env=env, capture_output=True, text=True, check=True)
    top = {}
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$", line)  # one space: a top-level import
        if match:
            top[match.group(2)] = int(match.group(1)) / 1000
    return sum(top.values()), sorted(top.items(), key=lambda item: -item[1])[:4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per case (default 7)")
    parser.add_argument("--before", type=Path, help="another checkout to measure alternately (e.g. an older commit)")
    args = parser.parse_args()
    trees = {"this checkout": Path(__file__).resolve().parent.parent}
    if args.before:
        trees = {"before": args.before.resolve(), "after": trees["this checkout"]}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.runs):
        for case, case_args in CASES.items():
            for name, tree in trees.items():
                results.setdefault((case, name), []).append(_run(tree, case_args))
    print(f"{'case':28s} {'tree':14s} {'median wall':>11s} {'worst':>7s} {'peak RSS':>9s}")
    for case in CASES:
        for name in trees:
            walls = [wall for wall, _ in results[(case, name)]]
            rss = statistics.median(r for _, r in results[(case, name)])
            print(f"{case:28s} {name:14s} {statistics.median(walls):10.3f}s {max(walls):6.3f}s {rss:7.0f}MB")
    for name, tree in trees.items():
        samples = [_import_time(tree) for _ in range(3)]
        total = statistics.median(total for total, _ in samples)
        largest = ", ".join(f"{module} {ms:.0f} ms" for module, ms in samples[0][1])
        print(f"-X importtime, {name}: {total:.0f} ms in top-level imports (largest: {largest})")


if __name__ == "__main__":
    main()
