"""Rank-side half of tests/test_rank_agreement.py: ranks that disagree about who they are.

Each of ``world`` gloo ranks builds the token-budget sampler, ``pack_rows``, a sampler through
``sampler_for_trainer`` (what every ``install()`` builds) and a ``StepPlanner(dp_group=...)`` with
arguments that differ between the ranks in one way per scenario, and records per rank what
happened (the plan, or the error). Every scenario ends with an error on every rank or none, so
the ranks stay in step; a rank left waiting would stall the run past the process group's
timeout and the test's deadline. The test process makes every assertion.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from typing import Any, Callable

import numpy as np

TIMEOUT_S = 30.0
CAP = 512
LENGTHS = np.random.default_rng(11).integers(10, 300, 90).tolist()


def sampler_kwargs(scenario: str, rank: int, world: int) -> dict:
    """The token-budget sampler's replica arguments of ``rank`` in ``scenario``."""
    if scenario == "alone_on_rank_0":  # believes it is alone; the others do not
        return dict(num_replicas=1, rank=0) if rank == 0 else dict(num_replicas=world, rank=rank)
    if scenario == "everyone_alone":  # all agree on 1 replica, in a group of several
        return dict(num_replicas=1, rank=0)
    if scenario == "same_rank":  # ranks 0 and 1 both claim rank 0
        return dict(num_replicas=world, rank=0 if rank == 1 else rank)
    if scenario == "out_of_range":  # the last rank claims rank=world
        return dict(num_replicas=world, rank=world if rank == world - 1 else rank)
    if scenario == "numpy_ints":
        return dict(num_replicas=np.int64(world), rank=np.int32(rank))
    if scenario == "defaults":
        return {}
    raise KeyError(scenario)


SAMPLER_SCENARIOS = ("alone_on_rank_0", "everyone_alone", "same_rank", "out_of_range", "numpy_ints", "defaults")


class FakeTrainer:
    """What ``sampler_for_trainer`` reads of a transformers ``Trainer``: its ``args``."""

    class Args:
        def __init__(self, world_size: int, process_index: int) -> None:
            self.world_size, self.process_index = world_size, process_index
            self.seed, self.data_seed, self.gradient_accumulation_steps = 5, None, 1

    def __init__(self, world_size: int, process_index: int) -> None:
        self.args = self.Args(world_size, process_index)


def planner_run(scenario: str, rank: int, world: int, group: Any) -> dict:
    """A StepPlanner on ``dp_group``: step 0 where the ranks disagree (``flush`` or
    ``num_replicas``), then steps where they agree; each rank adds its own arrivals."""
    from seqbal import StepPlanner

    replicas = world
    if scenario == "planner_alone_on_rank_0" and rank == 0:
        replicas = 1
    if scenario == "planner_everyone_alone":
        replicas = 1
    planner = StepPlanner(CAP, replicas, micro_batches_per_step=1, dp_group=group)
    record: dict[str, Any] = {"steps": [], "errors": [], "pending": []}
    for step in range(3):
        base = (step * 10 + rank) * 100
        # group ids as a tensor: read by value (0-d tensors would hash by identity)
        import torch

        planner.add([base, base + 1, base + 2, base + 3], [40, 50, 60, 70], groups=torch.tensor([1, 1, 2, 2]))
        flush = step == 2 or (scenario == "planner_flush_on_rank_0" and step == 0 and rank == 0)
        before = planner.pending
        try:
            record["steps"].append(planner.next_step(flush=flush))
        except ValueError as error:
            record["steps"].append("error")
            record["errors"].append(str(error))
            record["unchanged"] = planner.pending == before
        record["pending"].append(planner.pending)
    return record


PLANNER_SCENARIOS = ("planner_flush_on_rank_0", "planner_alone_on_rank_0", "planner_everyone_alone")


def outcome(build: Callable[[], Any]) -> dict:
    try:
        return {"ok": True, "value": build()}
    except ValueError as error:
        return {"ok": False, "error": str(error)}


def main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from tests.process_group import close_process_group

    from seqbal.epochs.sampler import TokenBudgetBatchSampler, pack_rows
    from seqbal.integrations.trl import sampler_for_trainer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    records: dict[str, Any] = {}
    try:
        for scenario in SAMPLER_SCENARIOS:
            def build(scenario: str = scenario) -> Any:
                sampler = TokenBudgetBatchSampler(LENGTHS, CAP, seed=3, **sampler_kwargs(scenario, rank, world))
                return {"len": len(sampler), "mine": [list(sampler.epoch_plan(e)[sampler.rank]) for e in range(3)],
                        "rank": sampler.rank}
            records[scenario] = outcome(build)
        records["pack_alone_on_rank_0"] = outcome(
            lambda: pack_rows(LENGTHS, CAP, num_replicas=1 if rank == 0 else world))
        records["pack_agreed"] = outcome(lambda: pack_rows(LENGTHS, CAP, num_replicas=world))
        records["pack_once_for_the_group"] = outcome(lambda: pack_rows(LENGTHS, CAP, num_replicas=1))
        records["trainer_alone_on_rank_0"] = outcome(lambda: len(sampler_for_trainer(
            TokenBudgetBatchSampler, FakeTrainer(1 if rank == 0 else world, 0 if rank == 0 else rank), LENGTHS, CAP)))
        for scenario in PLANNER_SCENARIOS:
            records[scenario] = planner_run(scenario, rank, world, dist.group.WORLD)
    except Exception:  # recorded, not raised: the test reads it
        records["crash"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(records, handle)
    close_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
