"""Hash every plan of the benchmark grid, to show that a refactor leaves plans unchanged.

    python -m benchmarks.plan_hashes --out benchmarks/plan_hashes.json    # record
    python -m benchmarks.plan_hashes --check benchmarks/plan_hashes.json  # compare, exit 1 on a change

Covered: :func:`seqbal.plan_micro_batches` on the planning-cost grid (every family of
``benchmarks/workloads.py``, n 64 to 16384, caps 4096/16384/32768, as
``benchmarks/planning_cost_after.json``), with a divisor and a minimum on part of it;
:func:`seqbal.plan_data_parallel` (4 ranks, single process), :func:`seqbal.build_dp_schedule`
(token and padded costs), :func:`seqbal.capped_balanced_partitions` at several counts, and 40
inputs near a third of the cap (the inputs where the count search's tries matter most). Each
case is one SHA-256 of its output; the record keeps them per case, so a change names the
cases it touched. A plan is deterministic, so equal hashes mean equal plans.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402
from seqbal import (  # noqa: E402
    build_dp_schedule,
    calculate_workload,
    capped_balanced_partitions,
    plan_data_parallel,
    plan_micro_batches,
)

SIZES = (64, 256, 1024, 4096, 16384)
CAPS = (4096, 16384, 32768)


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, default=int).encode()).hexdigest()[:16]


def cases(sizes):
    """(name, thunk) for every case; a thunk returns a JSON-able plan."""
    families = workloads.families()
    for family, generate in families.items():
        for n in sizes:
            for cap in CAPS:
                lengths, group = generate(n, cap, workloads.case_seed(family, n, cap))
                yield f"plan/{family}/{n}/{cap}", (lambda l=lengths, c=cap, g=group: plan_micro_batches(l, c, force_group_size=g))
                if n <= 1024:
                    yield (f"plan-div2-min3/{family}/{n}/{cap}",
                           lambda l=lengths, c=cap, g=group: plan_micro_batches(
                               l, c, force_group_size=g, num_batches_divided_by=2, min_num_micro_batch=3))
    for family in ("lognormal", "bimodal_rl", "pareto", "grpo_groups"):
        for n, cap in ((1024, 4096), (4096, 16384)):
            lengths, group = families[family](n, cap, workloads.case_seed(family, n, cap))
            yield f"data-parallel/{family}/{n}/{cap}", (
                lambda l=lengths, c=cap, g=group: plan_data_parallel(
                    [l[r::4] if g == 1 else l.reshape(-1, g)[r::4].reshape(-1) for r in range(4)], c,
                    force_group_size=g))
            yield f"schedule/{family}/{n}/{cap}", (
                lambda l=lengths, c=cap, g=group: build_dp_schedule(l, 8, c, force_group_size=g).micro_batches)
            yield f"schedule-padded/{family}/{n}/{cap}", (
                lambda l=lengths, c=cap, g=group: build_dp_schedule(
                    l, 4, c, force_group_size=g, cost_model="padded").micro_batches)
    for family in ("lognormal", "uniform", "real_qwen_rollouts"):
        if family not in families:
            continue
        for n, cap in ((256, 4096), (2048, 16384)):
            lengths, _ = families[family](n, cap, workloads.case_seed(family, n, cap))
            work = calculate_workload(lengths)
            low = -(-int(lengths.sum()) // cap)
            for k in (low, low + 1, low + 3, 2 * low + 5):
                yield f"capped/{family}/{n}/{cap}/k{k}", (
                    lambda l=lengths, w=work, c=cap, k=k: capped_balanced_partitions(l, w, c, k))
    for seed in range(40):  # near a third of the cap: where the count search's tries decide
        rng = np.random.default_rng(seed)
        n = int(rng.integers(100, 600))
        lengths = rng.integers(1160, 1570, n)
        yield f"near-third/{seed}", (lambda l=lengths: plan_micro_batches(l, 4096))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", type=int, default=list(SIZES))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--check", type=Path, default=None)
    args = parser.parse_args(argv)
    hashes = {name: digest(thunk()) for name, thunk in cases(args.sizes)}
    total = digest(sorted(hashes.items()))
    print(f"{len(hashes)} cases, digest {total}")
    if args.out:
        args.out.write_text(json.dumps({"digest": total, "cases": hashes}, indent=1) + "\n")
    if args.check:
        record = json.loads(args.check.read_text())["cases"]
        changed = sorted(name for name in hashes if name in record and record[name] != hashes[name])
        missing = sorted(set(record) - set(hashes))
        for name in changed:
            print(f"CHANGED {name}")
        print(f"{len(changed)} changed, {len(hashes) - len(changed)} identical, {len(missing)} not run")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
