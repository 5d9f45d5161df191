"""The token-budget sampler and ``pack_rows`` on 2 gloo ranks whose inputs differ: every rank
raises the same ``ValueError`` (what differs, and where), none hangs; identical inputs plan
identically. One torchrun run of ``tests/sampler_agreement_workers.py`` under a hard deadline."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.deadline import run_with_deadline

pytest.importorskip("torch")
WORKERS = Path(__file__).with_name("sampler_agreement_workers.py")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("agreement")
    env = dict(os.environ, PYTHONPATH=str(WORKERS.parent.parent), OMP_NUM_THREADS="1")
    result = run_with_deadline(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKERS), str(out)],
        deadline_s=240, env=env, what="the 2-rank sampler agreement run",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _errors(records, scenario):
    outcomes = [r[scenario] for r in records]
    assert not any(o["ok"] for o in outcomes), f"{scenario}: a rank built it: {outcomes}"
    return [o["error"] for o in outcomes]


def test_identical_inputs_give_one_plan_shared_by_the_ranks(records):
    for scenario in ("same", "same_again"):
        a, b = (r[scenario] for r in records)
        assert a["ok"] and b["ok"] and a["len"] == b["len"]
        assert a["plans"] == b["plans"]
        assert a["mine"] == a["plans"][0][0] and b["mine"] == b["plans"][0][1]
    a, b = (r["pack_same"] for r in records)
    assert a["ok"] and a["rows"] == b["rows"]


def test_one_token_on_one_sample_is_an_error_on_every_rank_naming_the_sample(records):
    errors = _errors(records, "one_token")
    for error in errors:
        assert "different lengths" in error and "first differ at sample 123" in error
        assert "1 sample(s) differ" in error
    pack_errors = _errors(records, "pack_one_token")
    assert all("pack_rows" in e and "sample 123" in e for e in pack_errors)


def test_a_different_dataset_size_is_an_error_on_every_rank(records):
    for error in _errors(records, "one_more_sample"):
        assert "different datasets: from 600 to 601 samples" in error


@pytest.mark.parametrize("scenario, name", [("other_seed", "seed"), ("other_ga", "gradient_accumulation_steps")])
def test_a_different_setting_is_an_error_on_every_rank_naming_it(records, scenario, name):
    errors = _errors(records, scenario)
    for error in errors:
        assert "different settings" in error and f"{name} (from" in error
    if name == "gradient_accumulation_steps":
        assert "from 2 to 4" in errors[0] and "2 here" in errors[0] and "4 here" in errors[1]


def test_an_error_on_one_rank_is_raised_on_every_rank(records):
    own, peer = _errors(records, "bad_ga_on_one_rank")[1], _errors(records, "bad_ga_on_one_rank")[0]
    assert "gradient_accumulation_steps must be a positive int" in own
    assert "rank 1 of the process group failed" in peer


def test_an_over_long_sample_is_the_same_error_on_every_rank(records):
    errors = _errors(records, "over_the_cap")
    assert errors[0] == errors[1] and "sample 5 has 9000 tokens, which exceeds max_token_len=8192" in errors[0]
