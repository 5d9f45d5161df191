"""Synced mode across real processes: 2 and 4 ranks on gloo (and NCCL when two GPUs are visible).

Each world size is spawned once per test session and runs every scenario of
``distributed_workers.build_scenarios`` (a process that imports torch costs seconds here); the
tests below only read its per-rank records. The spawn is shared between pytest-xdist workers
through a file lock, and a spawn that fails is recorded too, so it is never retried per test.

Nothing can stall the suite: every scenario runs in a process group with a short timeout, and
the parent kills all ranks and fails once ``DEADLINE_S`` has passed. Two detector tests prove
that the checks would catch a second pass of the within-limit loop and a rank left waiting.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import time
from typing import Any, Optional

import pytest
import torch
import torch.distributed as dist
from filelock import FileLock

from . import distributed_workers as workers
from .distributed_workers import CAP, HANG_TIMEOUT_S, SCENARIO_TIMEOUT_S, Scenario, build_scenarios
from .invariants import assert_plan_invariants
from seqbal import plan_micro_batches

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

# Hard limit on one world's whole run (spawn, torch import, every scenario). A healthy run
# takes about 10 s here; past this the ranks are killed and every test of that world fails.
DEADLINE_S = 150.0
WORLDS = (2, 4)

NCCL_SKIP_REASON = (
    f"NCCL variant needs at least 2 visible CUDA devices, found {torch.cuda.device_count()}"
)
BACKENDS = [
    pytest.param("gloo", id="gloo"),
    pytest.param(
        "nccl",
        id="nccl",
        marks=pytest.mark.skipif(
            not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
            reason=NCCL_SKIP_REASON,
        ),
    ),
]


# ---------------------------------------------------------------------------------------------
# Harness: spawn, deadline, records
# ---------------------------------------------------------------------------------------------


class RanksFailed(AssertionError):
    """The ranks did not all finish in time, or one crashed outside a scenario."""


def spawn_ranks(jobs: list[tuple[Any, int, tuple]], deadline_s: float) -> list[list[int]]:
    """Start every job ``(target, world, args)`` as ``world`` spawned processes running
    ``target(rank, *args)``, all at once; return the exit codes, job by job.

    Raises:
        RanksFailed: a process was still running at the deadline (every survivor is killed
            first, so nothing outlives the test).
    """
    context = multiprocessing.get_context("spawn")
    processes = [
        [context.Process(target=target, args=(rank, *args), daemon=True) for rank in range(world)]
        for target, world, args in jobs
    ]
    flat = [process for job in processes for process in job]
    end = time.monotonic() + deadline_s
    try:
        for process in flat:
            process.start()
        for process in flat:
            process.join(max(0.0, end - time.monotonic()))
        stragglers = [
            f"{world}-rank job: ranks {[rank for rank, p in enumerate(job) if p.is_alive()]}"
            for (_, world, _), job in zip(jobs, processes)
            if any(p.is_alive() for p in job)
        ]
        if stragglers:
            raise RanksFailed(f"still running after the {deadline_s:.0f} s deadline (a hang): {stragglers}")
        return [[process.exitcode for process in job] for job in processes]
    finally:
        for process in flat:
            if process.is_alive():
                process.kill()
        for process in flat:
            if process.pid is not None:
                process.join(5)


def _collect(world: int, out_dir: str, exit_codes: Optional[list[int]], failure: Optional[str]) -> dict[str, Any]:
    """Records of one world: ``{"records": {name: [record of each rank]}}``, or
    ``{"failure": text}`` saying how far each rank got."""
    per_rank = []
    for rank in range(world):
        path = os.path.join(out_dir, f"rank{rank}.jsonl")
        lines = open(path, encoding="utf-8").read().splitlines() if os.path.exists(path) else []
        per_rank.append([json.loads(line) for line in lines])
    crashes = [r for records in per_rank for r in records if r["name"] == "__crash__"]
    unfinished = [rank for rank, records in enumerate(per_rank) if not any(r["name"] == "__done__" for r in records)]
    if failure is None and (crashes or unfinished or any(code != 0 for code in exit_codes or [])):
        failure = f"exit codes {exit_codes}, unfinished ranks {unfinished}"
    if failure is not None:
        done = {rank: [r["name"] for r in records] for rank, records in enumerate(per_rank)}
        details = "\n".join(r["traceback"] for r in crashes)
        return {"failure": f"{failure}; scenarios recorded per rank: {done}\n{details}"}
    records: dict[str, list[dict[str, Any]]] = {}
    for records_of_rank in per_rank:
        for record in records_of_rank:
            records.setdefault(record["name"], []).append(record)
    return {"records": records}


def _run_worlds(backend: str, root: str) -> dict[int, dict[str, Any]]:
    """Spawn the 2-rank and the 4-rank world together, so that their torch imports overlap."""
    stores, jobs, out_dirs = [], [], {}
    worlds = [w for w in WORLDS if backend != "nccl" or w <= torch.cuda.device_count()]
    for world in worlds:
        store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)  # port 0: no races
        stores.append(store)  # the parent hosts each world's rendezvous until the ranks exit
        out_dirs[world] = os.path.join(root, f"{backend}-{world}")
        os.makedirs(out_dirs[world], exist_ok=True)
        jobs.append((workers.worker_main, world, (world, backend, store.port, out_dirs[world])))
    started = time.monotonic()
    try:
        codes, failure = spawn_ranks(jobs, DEADLINE_S), None
    except RanksFailed as error:
        codes, failure = [None] * len(worlds), str(error)
    seconds = time.monotonic() - started
    results = {world: _collect(world, out_dirs[world], code, failure) for world, code in zip(worlds, codes)}
    for result in results.values():
        result["seconds"] = seconds
    return results


_LOCAL_CACHE: dict[str, dict[int, dict[str, Any]]] = {}


@pytest.fixture(scope="session")
def world_records(tmp_path_factory):
    """``get(world, backend)`` -> records by scenario name. Both worlds of a backend are
    spawned once per session and shared by the xdist workers through a file lock on their
    common temporary directory (pytest-xdist's recipe for session fixtures)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent

    def get(world: int, backend: str) -> dict[str, list[dict[str, Any]]]:
        if backend not in _LOCAL_CACHE:
            result_path = shared / f"seqbal-dist-{backend}.pkl"
            with FileLock(str(result_path) + ".lock"):
                if result_path.exists():
                    results = pickle.loads(result_path.read_bytes())
                else:
                    results = _run_worlds(backend, str(shared / "seqbal-dist"))
                    result_path.write_bytes(pickle.dumps(results))
            _LOCAL_CACHE[backend] = results
        if world not in _LOCAL_CACHE[backend]:
            found = torch.cuda.device_count()
            pytest.skip(f"{backend} world of {world} ranks needs one CUDA device per rank, found {found}")
        result = _LOCAL_CACHE[backend][world]
        if "failure" in result:
            pytest.fail(f"{backend} world of {world} ranks failed: {result['failure']}", pytrace=False)
        return result["records"]

    return get


# ---------------------------------------------------------------------------------------------
# Checks (shared by every scenario; the detector tests show they fail on broken behaviour)
# ---------------------------------------------------------------------------------------------


def _local_plan(scenario: Scenario, rank: int) -> list[list[int]]:
    """The plan ``rank`` makes alone (no sync), computed in the test process."""
    kwargs = scenario.call_kwargs(rank)
    kwargs["same_micro_num_in_dp"] = False
    return plan_micro_batches(scenario.lengths[rank], **kwargs)


def _local_count(scenario: Scenario, rank: int) -> int:
    return len(_local_plan(scenario, rank))


def _expects_error(scenario: Scenario, rank: int, world: int) -> bool:
    if scenario.cannot_satisfy or scenario.all_raise:
        return True
    return any(bad in scenario.bad_ranks for bad in scenario.group_of(rank, world))


def check_collectives(scenario: Scenario, records: list[dict[str, Any]], world: int, backend: str) -> None:
    """Two all-reduces per synced call that returns, one per synced call that raises, none
    when not syncing; no other collective; tensors on the backend's device."""
    device = "cuda" if backend == "nccl" else "cpu"
    for rank, record in enumerate(records):
        if not scenario.synced:
            expected = 0
        else:
            expected = 1 if _expects_error(scenario, rank, world) else 2
        assert record["all_reduce_calls"] == expected, (
            f"rank {rank}: {record['all_reduce_calls']} all_reduce calls, expected {expected}"
        )
        assert record["other_collectives"] == [], f"rank {rank} called {record['other_collectives']}"
        assert set(record["collective_devices"]) <= {device}, f"rank {rank}: {record['collective_devices']}"


def check_outcomes(scenario: Scenario, records: list[dict[str, Any]], world: int) -> None:
    """Every rank either returns a valid plan with its group's agreed count, or raises a
    ValueError saying why, within bounded time, together with the rest of its group."""
    assert [r["rank"] for r in records] == list(range(world)), "a rank has no record"
    for rank, record in enumerate(records):
        assert record["elapsed_s"] < SCENARIO_TIMEOUT_S / 2, (
            f"rank {rank} took {record['elapsed_s']:.1f} s: it waited on a peer"
        )
        if _expects_error(scenario, rank, world):
            assert record["outcome"] == "error", f"rank {rank} returned while its group must raise"
            assert record["is_value_error"], f"rank {rank} raised {record['error_type']}: {record.get('traceback')}"
            message = record["message"]
            if scenario.all_raise:
                for expected in scenario.all_raise:
                    assert expected in message, f"rank {rank}'s error lacks {expected!r}: {message}"
                assert message == records[0]["message"], f"ranks 0 and {rank} raised different errors"
                continue
            if scenario.cannot_satisfy:
                assert message.startswith("Cannot satisfy max_token_len"), f"rank {rank}: {message}"
            if rank in scenario.bad_ranks:
                for expected in scenario.bad_ranks[rank]:
                    assert expected in message, f"rank {rank}'s own error lacks {expected!r}: {message}"
            else:
                group = scenario.group_of(rank, world)
                named = scenario.named_rank
                if named is None:
                    bad_here = [group.index(bad) for bad in scenario.bad_ranks if bad in group]
                    named = bad_here[0] if len(bad_here) == 1 else None
                if named is not None:
                    assert f"rank {named} " in message, f"rank {rank} does not name rank {named}: {message}"
                    if group[named] != named:  # a subgroup: the global rank is named too
                        assert f"(global rank {group[named]})" in message, f"rank {rank}: {message}"
            continue
        assert record["outcome"] == "ok", f"rank {rank} raised {record.get('error_type')}: {record.get('message')}"
        kwargs = scenario.call_kwargs(rank)
        lengths = scenario.lengths[rank]
        parts = record["parts"]
        assert_plan_invariants(
            lengths,
            parts,
            kwargs["max_token_len"],
            force_group_size=kwargs.get("force_group_size", 1),
            num_batches_divided_by=kwargs.get("num_batches_divided_by"),
            min_num_micro_batch=kwargs.get("min_num_micro_batch"),
            cost_model=kwargs.get("cost_model"),
            max_samples_per_micro_batch=kwargs.get("max_samples_per_micro_batch"),
        )
        group = scenario.group_of(rank, world)
        # the agreed count is the smallest common one: the largest count any member needs alone
        agreed = max(_local_count(scenario, member) for member in group)
        assert len(parts) == agreed, f"rank {rank}: {len(parts)} micro-batches, group {group} needs {agreed}"
        if _local_count(scenario, rank) == agreed:  # the agreement changed nothing for this rank
            assert parts == _local_plan(scenario, rank), f"rank {rank}: synced plan differs from its own"
        for member in group:
            theirs = records[member].get("parts")
            assert theirs is not None and len(theirs) == len(parts), f"ranks {rank} and {member} disagree"
        if scenario.api != "plan":
            assert record["mb_ids"] == parts, f"rank {rank}: micro-batch contents differ from the indices"
            expected_tokens = [sum(lengths[i] for i in part) for part in parts]
            assert record["mb_tokens"] == expected_tokens, f"rank {rank}: tokens read from the micro-batches"
            assert max(record["mb_tokens"]) <= kwargs["max_token_len"]
            assert record["restored_ids"] == list(range(len(lengths))), f"rank {rank}: restore order wrong"
            assert record["restored_exact"], f"rank {rank}: restore_dynamic_batch did not reproduce the batch"
        if scenario.api == "verl":
            assert record["non_tensor_exact"], f"rank {rank}: non_tensor_batch rows differ from the indices"


SCENARIOS = {world: {s.name: s for s in build_scenarios(world)} for world in (2, 4)}


def _names(world: int, predicate) -> list[str]:
    return [name for name, s in SCENARIOS[world].items() if s.hook is None and predicate(s)]


def _cases(predicate) -> list:
    return [
        pytest.param(world, name, id=f"{world}ranks-{name}")
        for world in (2, 4)
        for name in _names(world, predicate)
    ]


def _check(world_records, backend: str, world: int, name: str) -> None:
    scenario = SCENARIOS[world][name]
    records = world_records(world, backend)[name]
    check_outcomes(scenario, records, world)
    check_collectives(scenario, records, world, backend)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("world", "name"), _cases(lambda s: s.synced and not s.expect_error and s.group != "pairs"))
def test_synced_ranks_agree(world_records, backend, world, name):
    """Different batch sizes and length distributions per rank: one count, cap, every sample
    once, round trip exact, exactly two all-reduces."""
    _check(world_records, backend, world, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("world", "name"), _cases(lambda s: not s.synced))
def test_no_sync_calls_no_collective(world_records, backend, world, name):
    """same_micro_num_in_dp=False or dp_group=None: local plans, zero collectives."""
    _check(world_records, backend, world, name)
    scenario = SCENARIOS[world][name]
    for rank, record in enumerate(world_records(world, backend)[name]):
        kwargs = scenario.call_kwargs(rank)
        kwargs.pop("same_micro_num_in_dp", None)
        assert record["parts"] == plan_micro_batches(scenario.lengths[rank], **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("world", "name"), _cases(lambda s: s.synced and s.expect_error and s.group != "pairs")
)
def test_error_on_one_rank_raises_everywhere(world_records, backend, world, name):
    """Bad data or arguments on one rank: every rank raises ValueError, promptly, after one
    all-reduce; the bad rank with its own numbers, the others naming it."""
    _check(world_records, backend, world, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_raises_the_agreed_code_with_its_own_message(world_records, backend, world):
    """Issue 17.7: rank 0 cannot satisfy its minimum (code 1), the last rank has a sample over
    the cap (code 3): both keep their own message, and every rank raises code 3."""
    records = world_records(world, backend)["err_codes_agree"]
    assert [r["error_code"] for r in records] == [3] * world, [r.get("message") for r in records]
    assert records[0]["message"].startswith("Cannot satisfy max_token_len")
    assert "exceeds max_token_len" in records[-1]["message"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("suffix", ["", "_divided"])
@pytest.mark.parametrize("world", [2, 4])
def test_single_rank_group_equals_no_sync(world_records, backend, world, suffix):
    records = world_records(world, backend)
    synced = records["single_sync" + suffix]
    local = records["single_nosync" + suffix]
    assert [r["all_reduce_calls"] for r in synced] == [2] * world
    assert [r["parts"] for r in synced] == [r["parts"] for r in local]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", _names(4, lambda s: s.group == "pairs"))
def test_subgroups_agree_on_their_own_count(world_records, backend, name):
    """Four ranks, DP groups (0, 1) and (2, 3) made with new_group: each pair agrees on its
    own count; an error in one pair leaves the other pair untouched."""
    _check(world_records, backend, 4, name)
    records = world_records(4, backend)[name]
    if name == "pairs_own_count":
        assert [len(r["parts"]) for r in records] == [3, 3, 8, 8]
    if name == "pairs_error_in_one_pair":
        assert [r["outcome"] for r in records] == ["ok", "ok", "error", "error"]
        assert "rank 1 of the data-parallel group (global rank 3) failed" in records[2]["message"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 4])
def test_detector_second_pass_is_caught(world_records, backend, world):
    """Force the within-limit loop into a second pass (rank 0's first partition fails): the
    ranks still agree, but the collective check above must reject the run."""
    scenario = SCENARIOS[world]["detector_second_pass"]
    records = world_records(world, backend)["detector_second_pass"]
    assert [r["outcome"] for r in records] == ["ok"] * world
    assert [r["all_reduce_calls"] for r in records] == [3] * world
    counts = {len(r["parts"]) for r in records}
    assert counts == {max(_local_count(scenario, rank) for rank in range(world)) + 1}
    with pytest.raises(AssertionError, match="3 all_reduce calls, expected 2"):
        check_collectives(scenario, records, world, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 4])
def test_partitioner_exception_after_agreement_reaches_every_rank(world_records, backend, world):
    """Rank 0's partitioner raises after the first all-reduce (an internal bug): it raises its
    own exception, every peer raises too, naming rank 0, and nobody waits for a timeout."""
    records = world_records(world, backend)["fault_partition_raises"]
    assert [r["outcome"] for r in records] == ["error"] * world
    assert records[0]["error_type"] == "RuntimeError" and records[0]["message"] == "injected partitioner bug"
    for record in records[1:]:
        assert record["error_type"] == "RuntimeError", record
        assert "rank 0 of the data-parallel group failed while partitioning" in record["message"]
    assert [r["all_reduce_calls"] for r in records] == [2] * world
    assert max(r["elapsed_s"] for r in records) < SCENARIO_TIMEOUT_S / 2


@pytest.mark.parametrize("world", [2, 4])
def test_detector_peer_left_waiting_is_caught(world_records, world):
    """Rank 1 skips the call: its peers fail with the group's timeout (not a hang, not a
    ValueError), and the outcome check rejects it."""
    scenario = SCENARIOS[world]["detector_hang"]
    records = world_records(world, "gloo")["detector_hang"]
    assert records[1].get("skipped_call")
    for rank, record in enumerate(records):
        if rank == 1:
            continue
        assert record["outcome"] == "error" and not record["is_value_error"], record
        assert HANG_TIMEOUT_S * 0.5 <= record["elapsed_s"] < SCENARIO_TIMEOUT_S, record["elapsed_s"]
    with pytest.raises(AssertionError):
        check_outcomes(scenario, records, world)


def test_deadline_kills_a_hung_rank():
    """The parent's deadline turns a rank that never returns into a failure, and kills it."""
    started = time.monotonic()
    with pytest.raises(RanksFailed, match=r"deadline \(a hang\): \['1-rank job: ranks \[0\]'\]"):
        spawn_ranks([(workers.sleep_forever, 1, ())], deadline_s=1.0)
    assert time.monotonic() - started < 30


def test_scenarios_cover_the_issue():
    """The scenario list keeps every case issue 3 asks for (a guard against silent pruning)."""
    for world in (2, 4):
        names = set(SCENARIOS[world])
        for required in (
            "err_sample_over_cap",
            "err_forced_group_over_cap",
            "err_cannot_satisfy_agreed",
            "err_empty_batch",
            "err_bad_max_token_len_zero",
            "nosync_flag",
            "nosync_no_group",
            "single_sync",
            "dense_mixed",
            "jagged_mixed",
        ):
            assert required in names, (world, required)
        sizes = {len(x) for x in SCENARIOS[world]["plan_mixed"].lengths}
        assert len(sizes) == world, "every rank should have its own batch size"
        for required in (  # issue 13
            "err_mismatch_divisor",
            "err_mismatch_divisor_hang",
            "err_mismatch_cap",
            "err_mismatch_group_size",
            "err_unindexable_batch",
            "err_mask_of_halves",
            "plan_min_differs",
            "plan_numpy_arguments",
        ):
            assert required in names, (world, required)
        for required in (  # issue 17: one rank used to raise before (or without) the agreement
            "err_hang_round_to",
            "err_hang_pack_round_to",
            "err_hang_verl_no_batch",
            "err_verl_no_batch_with_dummies",
            "err_verl_short_non_tensor",
            "err_hang_sync_flag",
            "err_balance_flag",
            "err_codes_agree",
            "verl_mixed",
        ):
            assert required in names, (world, required)
    assert "pairs_own_count" in SCENARIOS[4]
    assert CAP == SCENARIOS[2]["plan_mixed"].kwargs["max_token_len"]
