"""The adapters' own checks of the trainer's objects are agreed: on 2 and 3 gloo ranks, one
rank's malformed object (a ``meta_info`` holding a lock, a non-scalar ``total_length``, an
``action_mask`` of None, an AReaL spec without a cap) makes every rank raise a ``ValueError``,
promptly, the bad rank with its own numbers and its peers naming it; nobody waits for a timeout.

Both worlds are spawned once (shared by xdist workers through a file lock, as in
tests/test_distributed.py) under that module's hard deadline. No trainer is needed.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch.distributed as dist
from filelock import FileLock

from . import adapter_workers as workers
from .distributed_workers import SCENARIO_TIMEOUT_S
from .invariants import assert_plan_invariants
from .test_distributed import DEADLINE_S, RanksFailed, _collect, spawn_ranks

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

WORLDS = (2, 3)


def _run(root: str) -> dict:
    stores, jobs, out_dirs = [], [], {}
    for world in WORLDS:
        store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        stores.append(store)
        out_dirs[world] = os.path.join(root, f"adapters-{world}")
        os.makedirs(out_dirs[world], exist_ok=True)
        jobs.append((workers.worker_main, world, (world, store.port, out_dirs[world])))
    try:
        codes, failure = spawn_ranks(jobs, DEADLINE_S), None
    except RanksFailed as error:
        codes, failure = [None] * len(WORLDS), str(error)
    return {world: _collect(world, out_dirs[world], code, failure) for world, code in zip(WORLDS, codes)}


@pytest.fixture(scope="session")
def adapter_records(tmp_path_factory):
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    path = shared / "seqbal-adapters.pkl"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            path.write_bytes(pickle.dumps(_run(str(shared / "seqbal-adapters"))))
        results = pickle.loads(path.read_bytes())

    def get(world: int) -> dict:
        if "failure" in results[world]:
            pytest.fail(f"adapter world of {world} ranks failed: {results[world]['failure']}", pytrace=False)
        return results[world]["records"]

    return get


CASES = [
    pytest.param(world, scenario, id=f"{world}ranks-{scenario.name}")
    for world in WORLDS
    for scenario in workers.build_scenarios(world)
]


@pytest.mark.parametrize(("world", "scenario"), CASES)
def test_adapter_outcome_is_agreed(adapter_records, world, scenario):
    records = adapter_records(world)[scenario.name]
    assert [r["rank"] for r in records] == list(range(world))
    for rank, record in enumerate(records):
        assert record["elapsed_s"] < SCENARIO_TIMEOUT_S / 2, f"rank {rank} waited on a peer: {record}"
        if scenario.bad_rank is None:
            assert record["outcome"] == "ok", record.get("traceback")
            continue
        assert record["outcome"] == "error", f"rank {rank} returned while rank {scenario.bad_rank} failed"
        assert record["is_value_error"], f"rank {rank} raised {record['error_type']}: {record['traceback']}"
        expected = scenario.own_message if rank == scenario.bad_rank else scenario.peer_message
        for text in expected:
            assert text in record["message"], f"rank {rank}'s error lacks {text!r}: {record['message']}"
    if scenario.bad_rank is not None:
        return
    counts = {len(r["indices"]) for r in records}
    if scenario.adapter == "openrlhf":  # per step: OpenRLHF's optimizer steps mark the steps' ends
        counts = {tuple(r["optimizer_step"]) for r in records}
    assert len(counts) == 1, f"the ranks disagree: {counts}"
    for record in records:
        if scenario.adapter == "openrlhf":
            steps = [record["lengths"][s * workers.STEP:(s + 1) * workers.STEP] for s in range(2)]
            ends = [i for i, flag in enumerate(record["optimizer_step"]) if flag]
            assert len(ends) == 2 and sorted(i for part in record["indices"] for i in part) == list(range(2 * workers.STEP))
            for s, (begin, end) in enumerate(zip([0, ends[0] + 1], ends)):
                parts = [[i - s * workers.STEP for i in part] for part in record["indices"][begin:end + 1]]
                assert_plan_invariants(steps[s], parts, workers.CAP)
        else:
            assert_plan_invariants(record["lengths"], record["indices"], workers.CAP)
        if scenario.adapter == "verl":
            assert record["uids"] == record["indices"] and record["meta_copied"]


def test_scenarios_cover_issue_30():
    names = {s.name for s in workers.build_scenarios(3)}
    assert {"verl_meta_info_lock", "openrlhf_total_length_not_scalar", "openrlhf_action_mask_none",
            "areal_spec_without_cap"} <= names
