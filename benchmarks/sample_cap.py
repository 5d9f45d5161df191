"""The sample cap's count and cost: max_samples_per_micro_batch against its bound and the plain plan.

    python -m benchmarks.sample_cap                              # real lists + a few families, Markdown table
    python -m benchmarks.sample_cap --sizes 1024 --caps 4096 --caps-samples 8 16 50 --json out.json

For every case (length family, n, token cap, sample cap M) one process plans the same lengths
with and without the sample cap and reports: the count with the cap, the bound it cannot beat
(``max(packing lower bound on tokens, ceildiv(n, M))``), the plain plan's count and its most
samples in a micro-batch (whether the cap binds at all), and the planning time of both in CPU
time (``time.process_time``, the median of ``--repeats``), so the ratio holds on a loaded machine.
Each capped plan is checked against both caps before it is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402
from seqbal import ceildiv, packing_lower_bound, plan_micro_batches  # noqa: E402

DEFAULT_FAMILIES = ("real_qwen_rollouts", "real_gsm8k", "real_codealpaca", "lognormal", "bimodal_rl", "grpo_groups")


def cpu_seconds(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return statistics.median(times), result


def run_case(family: str, n: int, cap: int, max_samples: int, repeats: int) -> dict:
    lengths, group = workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))
    lengths = np.asarray(lengths, dtype=np.int64)
    plain_s, plain = cpu_seconds(lambda: plan_micro_batches(lengths, cap, force_group_size=group), repeats)
    capped_s, capped = cpu_seconds(
        lambda: plan_micro_batches(lengths, cap, force_group_size=group, max_samples_per_micro_batch=max_samples), repeats
    )
    assert all(len(p) <= max_samples and int(lengths[p].sum()) <= cap for p in capped), "a cap was broken"
    assert sorted(i for p in capped for i in p) == list(range(len(lengths)))
    token_bound = packing_lower_bound(lengths.reshape(-1, group).sum(axis=1), cap)
    sample_bound = ceildiv(len(lengths) // group, max_samples // group)
    bound = max(token_bound, sample_bound)
    return {
        "family": family, "n": int(len(lengths)), "group": group, "cap": cap, "max_samples": max_samples,
        "count": len(capped), "bound": bound, "token_bound": token_bound, "sample_bound": sample_bound,
        "above_bound": len(capped) - bound, "plain_count": len(plain),
        "plain_most_samples": max(map(len, plain)), "plain_ms": 1000 * plain_s, "capped_ms": 1000 * capped_s,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| family | n | cap | M | count | bound max(tokens, ceildiv(n, M)) | above | plain count (most samples) | plan ms: plain / capped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['n']} | {r['cap']} | {r['max_samples']} | {r['count']} | "
            f"{r['bound']} ({r['token_bound']}, {r['sample_bound']}) | {r['above_bound']} ({r['above_bound'] / r['bound']:.1%}) | "
            f"{r['plain_count']} ({r['plain_most_samples']}) | {r['plain_ms']:.0f} / {r['capped_ms']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(DEFAULT_FAMILIES))
    parser.add_argument("--sizes", nargs="+", type=int, default=[1024, 16384])
    parser.add_argument("--caps", nargs="+", type=int, default=[4096, 16384])
    parser.add_argument("--caps-samples", nargs="+", type=int, default=[8, 16, 50])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    available = workloads.families()
    rows = []
    for family in args.families:
        if family not in available:
            print(f"skipped {family}: not available (real lists not checked out?)", file=sys.stderr)
            continue
        for n in args.sizes:
            for cap in args.caps:
                for max_samples in args.caps_samples:
                    rows.append(run_case(family, n, cap, max_samples, args.repeats))
                    print(f"{family} n={n} cap={cap} M={max_samples}: {rows[-1]['count']} vs {rows[-1]['bound']}",
                          file=sys.stderr)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
