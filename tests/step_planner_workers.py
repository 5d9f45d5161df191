"""Rank-side half of the StepPlanner distributed tests (tests/test_step_planner_distributed.py).

Each rank adds only its own arrivals to a planner with ``dp_group`` and records, per scenario,
its steps, the errors it raised and how many collectives each ``next_step`` called; the test
process makes every assertion (a wrong rank must still join the next collective, or a wrong
answer would become a hang). :func:`arrivals` is deterministic, so the parent rebuilds every
rank's arrivals and the steps a single planner given all of them would take.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from typing import Any

import numpy as np

CAP = 64
STEPS = 6
TIMEOUT_S = 30.0


def arrivals(rank: int, step: int, scenario: str) -> tuple[list[int], list[int], list[int]]:
    """This rank's arrivals before ``step``: (indices, lengths, groups); unique across ranks,
    except where the scenario wants a clash."""
    rng = np.random.default_rng(1000 * step + rank + 17 * len(scenario))
    groups = int(rng.integers(1, 3 if scenario == "wait" else 4))  # "wait": within (w + 1) x K x ranks
    size = 2
    n = groups * size
    base = (step * 16 + rank) * 1000
    indices = list(range(base, base + n))
    if scenario == "duplicate" and step == 2 and rank == 1:
        indices[0] = (step * 16 + 0) * 1000  # rank 0's first index of this step
    lengths = rng.integers(1, CAP // size + 1, n).tolist()
    return indices, lengths, [g for g in range(groups) for _ in range(size)]


SCENARIOS = {
    # name: planner keyword arguments
    "fixed_count": dict(micro_batches_per_step=2),
    "fixed_samples": dict(samples_per_step=6),
    "duplicate": dict(micro_batches_per_step=1),
    "mismatch": dict(micro_batches_per_step=1),
    "over_cap": dict(micro_batches_per_step=1),
    "wait": dict(micro_batches_per_step=1, max_wait_steps=2),
    "oldest_first": dict(micro_batches_per_step=2, oldest_first=True),
    "mismatch_oldest": dict(micro_batches_per_step=1),
}


def run_scenario(name: str, rank: int, world: int, dist: Any, group: Any) -> dict:
    from seqbal import StepPlanner

    kwargs = dict(SCENARIOS[name])
    if name == "mismatch" and rank == world - 1:
        kwargs["micro_batches_per_step"] = 2
    if name == "mismatch_oldest" and rank == world - 1:
        kwargs["oldest_first"] = True
    planner = StepPlanner(CAP, world, dp_group=group, **kwargs)
    calls = {"n": 0}
    original = dist.all_gather_object

    def counted(*args, **kw):
        calls["n"] += 1
        return original(*args, **kw)

    dist.all_gather_object = counted
    record: dict[str, Any] = {"steps": [], "errors": [], "add_errors": [], "collectives": []}
    try:
        for step in range(STEPS):
            indices, lengths, groups = arrivals(rank, step, name)
            if name == "over_cap" and step == 1 and rank == 0:
                try:
                    planner.add([999_999], [CAP + 1])
                except ValueError as error:
                    record["add_errors"].append(str(error))
            planner.add(indices, lengths, groups)
            before = calls["n"]
            try:
                record["steps"].append(planner.next_step(flush=step == STEPS - 1))
            except ValueError as error:
                record["steps"].append("error")
                record["errors"].append(str(error))
            record["collectives"].append(calls["n"] - before)
        record["pending"] = planner.pending
    finally:
        dist.all_gather_object = original
    return record


def main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from tests.process_group import close_process_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    results = {}
    for name in SCENARIOS:
        try:
            results[name] = run_scenario(name, rank, world, dist, dist.group.WORLD)
        except Exception:  # recorded, not raised: the peers must not be left waiting
            results[name] = {"crash": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(results, handle)
    close_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
