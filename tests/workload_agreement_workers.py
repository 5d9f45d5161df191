"""Run under torchrun (gloo, 2 ranks): every planner that agrees across ranks, given a
``workload_fn`` (or ``micro_batch_order``) that differs between the ranks in one way each, and
record per rank what happened, for ``tests/test_workload_agreement.py``. Every scenario ends
with an error on every rank or none, so the ranks stay in step from one scenario to the next; a
rank left waiting would stall the run, which the test's deadline turns into a failure."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch.distributed as dist

from seqbal import StepPlanner, TokenBudgetBatchSampler, make_workload_fn, plan_micro_batches
from seqbal.epochs.sampler import pack_rows
from tests.process_group import close_process_group

LENGTHS = np.random.default_rng(11).integers(20, 900, 64)
SAME = make_workload_fn(1024)
OTHER = make_workload_fn(2048)


def _negative(s):
    return -s


def _fn(rank: int, scenario: str):
    if scenario == "same":
        return SAME
    if scenario == "bad_on_one_rank":
        return _negative if rank == 1 else SAME
    if scenario == "default_and_custom":
        return None if rank == 0 else SAME
    return SAME if rank == 0 else OTHER


def _record(call):
    try:
        return {"ok": True, "result": call()}
    except ValueError as error:
        return {"ok": False, "error": str(error)}


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = dist.group.WORLD
    mine = (LENGTHS + rank * 7).tolist()
    records = {}
    for scenario in ("same", "different", "default_and_custom", "bad_on_one_rank"):
        fn = _fn(rank, scenario)
        records[f"plan_{scenario}"] = _record(lambda: plan_micro_batches(mine, 2048, dp_group=group, workload_fn=fn))
        records[f"sampler_{scenario}"] = _record(
            lambda: TokenBudgetBatchSampler(LENGTHS.tolist(), 2048, num_replicas=2, rank=rank, workload_fn=fn).epoch_plan())
        records[f"pack_{scenario}"] = _record(lambda: pack_rows(LENGTHS.tolist(), 2048, num_replicas=2, workload_fn=fn))

        def stream():
            planner = StepPlanner(2048, 2, micro_batches_per_step=2, dp_group=group, workload_fn=fn)
            planner.add([rank * 1000 + i for i in range(len(mine))], mine)
            return planner.next_step()

        if scenario != "bad_on_one_rank":  # a bad model is refused when the planner is built, before any collective
            records[f"stream_{scenario}"] = _record(stream)
    order = "pipeline" if rank == 0 else "largest_first"
    records["plan_order"] = _record(lambda: plan_micro_batches(mine, 2048, dp_group=group, micro_batch_order=order))
    records["plan_unordered"] = _record(lambda: plan_micro_batches(mine, 2048, dp_group=group,
                                                                   use_dynamic_bsz_balance=rank == 0))
    records["sampler_order"] = _record(lambda: TokenBudgetBatchSampler(
        LENGTHS.tolist(), 2048, num_replicas=2, rank=rank, micro_batch_order=None if rank == 0 else order).epoch_plan())

    def stream_order():
        planner = StepPlanner(2048, 2, micro_batches_per_step=2, dp_group=group, micro_batch_order=order)
        planner.add([rank * 1000 + i for i in range(len(mine))], mine)
        return planner.next_step()

    records["stream_order"] = _record(stream_order)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(records, f)
    close_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
