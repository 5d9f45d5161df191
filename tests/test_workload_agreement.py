"""Ranks that pass different workload models (or micro-batch orders) get the agreed error on
every rank, from every planner that agrees across ranks, with no new collective and no hang:
one torchrun run (gloo, 2 ranks) of ``tests/workload_agreement_workers.py`` under a hard
deadline."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.deadline import run_with_deadline

pytest.importorskip("torch")
WORKERS = Path(__file__).with_name("workload_agreement_workers.py")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("workload_agreement")
    env = dict(os.environ, PYTHONPATH=str(WORKERS.parent.parent), OMP_NUM_THREADS="1")
    result = run_with_deadline(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKERS), str(out)],
        deadline_s=240, env=env, what="the 2-rank workload agreement run",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _errors(records, scenario):
    outcomes = [r[scenario] for r in records]
    assert not any(o["ok"] for o in outcomes), f"{scenario}: a rank went on: {outcomes}"
    return [o["error"] for o in outcomes]


@pytest.mark.parametrize("planner", ["plan", "sampler", "pack", "stream"])
def test_the_same_model_on_every_rank_plans(records, planner):
    a, b = (r[f"{planner}_same"] for r in records)
    assert a["ok"] and b["ok"]
    if planner in ("sampler", "pack", "stream"):  # one shared plan
        assert a["result"] == b["result"]
    else:
        assert len(a["result"]) == len(b["result"])


@pytest.mark.parametrize("scenario", ["different", "default_and_custom"])
def test_different_models_are_the_agreed_error_on_every_rank(records, scenario):
    plan = _errors(records, f"plan_{scenario}")
    assert plan[0] == plan[1]  # the very same message: built from agreed values only
    assert "different arguments" in plan[0] and "workload_fn from" in plan[0]
    for who in ("sampler", "pack"):
        for error in _errors(records, f"{who}_{scenario}"):
            assert "different settings" in error and "workload_fn (from" in error
    for error in _errors(records, f"stream_{scenario}"):
        assert "disagree" in error and "workload_fn digest" in error


def test_a_bad_model_on_one_rank_is_raised_on_every_rank(records):
    own, peer = _errors(records, "plan_bad_on_one_rank")[1], _errors(records, "plan_bad_on_one_rank")[0]
    assert "negative workload" in own
    assert "rank 1 of the data-parallel group failed" in peer and "an argument is invalid" in peer
    for who in ("sampler", "pack"):
        own, peer = _errors(records, f"{who}_bad_on_one_rank")[1], _errors(records, f"{who}_bad_on_one_rank")[0]
        assert "negative workload" in own and "rank 1 of the process group failed" in peer


def test_different_orders_are_the_agreed_error_on_every_rank(records):
    plan = _errors(records, "plan_order")
    assert plan[0] == plan[1] and "micro_batch_order from 'pipeline' to 'largest_first'" in plan[0]
    unordered = _errors(records, "plan_unordered")  # one rank orders (pipeline), the other does not
    assert unordered[0] == unordered[1]
    assert "micro_batch_order from 'pipeline' to none (use_dynamic_bsz_balance=False)" in unordered[0]
    for error in _errors(records, "stream_order"):
        assert "disagree" in error and "micro_batch_order" in error
    for error in _errors(records, "sampler_order"):
        assert "different settings" in error and "micro_batch_order (from 0 to 2" in error
