"""StepPlanner with ``dp_group`` on 2 and 3 gloo ranks, under a hard deadline: each rank adds only
its own arrivals, and every rank must take the steps one planner given everyone's arrivals
takes, with one collective per step and every error raised on every rank alike."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch.distributed as dist

from seqbal import StepPlanner
from tests.deadline import run_with_deadline
from tests.step_invariants import Tracker
from tests.step_planner_workers import CAP, SCENARIOS, STEPS, arrivals

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

#: One world's whole run (spawn, torch import, every scenario); a healthy run takes seconds.
DEADLINE_S = 180.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def world(request, tmp_path_factory):
    size = request.param
    out = tmp_path_factory.mktemp(f"steps{size}")
    init = out / "init"
    script = (
        "import multiprocessing as mp, sys\n"
        "from tests.step_planner_workers import main\n"
        "if __name__ == '__main__':\n"
        f"    ps = [mp.get_context('spawn').Process(target=main, args=(r, {size}, {str(init)!r}, {str(out)!r})) "
        f"for r in range({size})]\n"
        "    [p.start() for p in ps]; [p.join() for p in ps]\n"
        "    sys.exit(max(p.exitcode for p in ps))\n"
    )
    result = run_with_deadline([sys.executable, "-c", script], deadline_s=DEADLINE_S, cwd=ROOT,
                               what=f"{size} ranks of the step planner")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]
    return size, records


def reference(name: str, size: int, skip_step: int = -1) -> list:
    """The steps of one planner given every rank's arrivals, rank by rank, before each step
    (a step in ``skip_step`` had its arrivals refused)."""
    planner = StepPlanner(CAP, size, **SCENARIOS[name])
    tracker = Tracker(CAP, size, k=SCENARIOS[name].get("micro_batches_per_step"),
                      s=SCENARIOS[name].get("samples_per_step"), wait=SCENARIOS[name].get("max_wait_steps"),
                      oldest_first=SCENARIOS[name].get("oldest_first", False))
    steps = []
    for step in range(STEPS):
        if step == skip_step:  # refused on every rank: no step taken
            steps.append("error")
            continue
        for rank in range(size):
            indices, lengths, groups = arrivals(rank, step, name)
            planner.add(indices, lengths, groups)
            tracker.added(indices, lengths, groups)
        result = planner.next_step(flush=step == STEPS - 1)
        tracker.check_step(result, step == STEPS - 1)
        steps.append(result)
    return steps


@pytest.mark.parametrize("name", ["fixed_count", "fixed_samples", "wait", "oldest_first"])
def test_every_rank_takes_the_steps_of_one_planner(world, name):
    size, records = world
    expected = reference(name, size)
    for rank, record in enumerate(records):
        assert "crash" not in record[name], record[name].get("crash")
        assert record[name]["steps"] == expected, f"rank {rank}"
        assert record[name]["collectives"] == [1] * STEPS, "one collective per step"
        assert not record[name]["errors"]


def test_an_index_on_two_ranks_raises_on_every_rank_and_loses_nothing_else(world):
    size, records = world
    messages = [record["duplicate"]["errors"] for record in records]
    assert all(m == messages[0] and len(m) == 1 for m in messages), messages
    assert "added by rank 0 and by rank 1" in messages[0][0]
    expected = reference("duplicate", size, skip_step=2)
    for record in records:
        assert record["duplicate"]["steps"] == expected
        assert record["duplicate"]["collectives"] == [1] * STEPS


@pytest.mark.parametrize("name, setting", [("mismatch", "micro_batches_per_step"),
                                           ("mismatch_oldest", "oldest_first")])
def test_a_rank_with_other_settings_makes_every_rank_raise(world, name, setting):
    size, records = world
    for record in records:
        assert "crash" not in record[name], record[name].get("crash")
        errors = record[name]["errors"]
        assert len(errors) == STEPS and "the ranks of dp_group disagree" in errors[0], errors
        assert f"rank {size - 1} has" in errors[0] and setting in errors[0], errors[0]


def test_an_over_cap_add_raises_on_its_rank_at_add_and_the_step_goes_on(world):
    size, records = world
    assert "sample 999999 has 65 tokens, which exceeds max_token_len=64" in records[0]["over_cap"]["add_errors"][0]
    expected = reference("over_cap", size)
    for rank, record in enumerate(records):
        assert record["over_cap"]["steps"] == expected
        assert bool(record["over_cap"]["add_errors"]) == (rank == 0)
