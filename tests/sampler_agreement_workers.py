"""Run under torchrun (gloo, 2 ranks): build the token-budget sampler and ``pack_rows`` on inputs
that differ between the ranks in one way each, and record per rank what happened, for
``tests/test_sampler_agreement.py``. Every scenario ends with an error on every rank or none, so
the ranks stay in step from one scenario to the next; a rank that waited forever would stall
the run, which the test's deadline turns into a failure."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch.distributed as dist

from seqbal.epochs.sampler import TokenBudgetBatchSampler, pack_rows
from tests.process_group import close_process_group

BASE = np.random.default_rng(7).integers(20, 900, 600)


def _lengths(rank: int, scenario: str) -> np.ndarray:
    lengths = BASE.copy()
    if rank == 1 and scenario == "one_token":
        lengths[123] += 1
    if rank == 1 and scenario == "one_more_sample":
        lengths = np.append(lengths, 50)
    if scenario == "over_the_cap":
        lengths[5] = 9000
    return lengths


def _kwargs(rank: int, scenario: str) -> dict:
    kwargs = dict(num_replicas=2, rank=rank, seed=3, gradient_accumulation_steps=2)
    if rank == 1 and scenario == "other_seed":
        kwargs["seed"] = 4
    if rank == 1 and scenario == "other_ga":
        kwargs["gradient_accumulation_steps"] = 4
    if rank == 1 and scenario == "bad_ga_on_one_rank":
        kwargs["gradient_accumulation_steps"] = 0
    return kwargs


SAMPLER_SCENARIOS = ("same", "one_token", "one_more_sample", "other_seed", "other_ga", "bad_ga_on_one_rank",
                     "over_the_cap", "same_again")
PACK_SCENARIOS = ("pack_same", "pack_one_token")


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    records = {}
    for scenario in SAMPLER_SCENARIOS:
        try:
            sampler = TokenBudgetBatchSampler(_lengths(rank, scenario), 8192, **_kwargs(rank, scenario))
            plans = [sampler.epoch_plan(e) for e in range(3)]
            records[scenario] = {"ok": True, "len": len(sampler), "plans": plans, "mine": list(sampler)}
        except ValueError as error:
            records[scenario] = {"ok": False, "error": str(error)}
    for scenario in PACK_SCENARIOS:
        lengths = _lengths(rank, "one_token" if scenario == "pack_one_token" else "same")
        try:
            records[scenario] = {"ok": True, "rows": pack_rows(lengths, 4096, num_replicas=2)}
        except ValueError as error:
            records[scenario] = {"ok": False, "error": str(error)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(records, f)
    close_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
