"""Rank side of the adapters' agreement scenarios (tests/test_adapter_agreement.py).

Each scenario calls one adapter's function on every rank with the trainer's own objects made by
hand (a verl ``DataProto``-like object, OpenRLHF replay-buffer samples, an AReaL
``MicroBatchSpec``-like spec), one rank's objects malformed. No trainer is imported: the
adapters read only what these stand-ins hold, so the scenarios run wherever torch does.

As in tests/distributed_workers.py, a rank never asserts (a wrong rank must still join the next
collective), records one JSON line per scenario, and meets its peers through the store between
scenarios, so that a scenario that leaves one rank behind fails alone.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass
from types import SimpleNamespace as NS
from typing import Any, Optional

from .distributed_workers import SCENARIO_TIMEOUT_S, FakeDataProto, _make_batch, _scenario_group, meet_again, rank_lengths, serve_scenarios

CAP = 4096
STEP = 8  # OpenRLHF samples per rank per training step


@dataclass(frozen=True)
class AdapterScenario:
    """One adapter call on every rank.

    Attributes:
        name: unique name.
        adapter: "verl", "openrlhf" or "areal".
        bad_rank: the rank whose objects are malformed (None: every rank's are fine).
        defect: what is malformed there (see :func:`_run_one`).
        own_message: substrings the bad rank's own error must hold.
        peer_message: substrings every other rank's error must hold.
    """

    name: str
    adapter: str
    bad_rank: Optional[int] = None
    defect: Optional[str] = None
    own_message: tuple[str, ...] = ()
    peer_message: tuple[str, ...] = ()


def build_scenarios(world: int) -> list[AdapterScenario]:
    last = world - 1
    peer = f"rank {last} of the data-parallel group failed"
    return [
        AdapterScenario("verl_ok", "verl"),
        # issue 30.1: the deep copy of meta_info failed after both all-reduces, on one rank
        AdapterScenario("verl_meta_info_lock", "verl", last, "meta_lock",
                        ("data.meta_info cannot be deep-copied", "'lock'"), (peer,)),
        AdapterScenario("openrlhf_ok", "openrlhf"),
        # issue 30.2: a non-scalar total_length raised before the step-count all-reduce ...
        AdapterScenario("openrlhf_total_length_not_scalar", "openrlhf", last, "total_length_2d",
                        ("replay buffer sample 5", "total_length", "shape (2,)"), (peer, "sample 5")),
        # ... and an action_mask of None in the bookkeeping after the plan
        AdapterScenario("openrlhf_action_mask_none", "openrlhf", 0, "action_mask_none",
                        ("replay buffer sample 2", "action_mask", "None"),
                        ("rank 0 of the data-parallel group failed", "sample 2")),
        AdapterScenario("openrlhf_over_cap", "openrlhf", last, "over_cap",
                        ("exceeds max_token_len", "OpenRLHF training step 0"), (peer,)),
        AdapterScenario("areal_ok", "areal"),
        # the audit: AReaL's spec was read (mb_spec.max_tokens_per_mb) outside the agreement
        AdapterScenario("areal_spec_without_cap", "areal", last, "spec_without_cap",
                        ("mb_spec.max_tokens_per_mb=None", "max_token_len must be a positive int"), (peer,)),
    ]


def openrlhf_lengths(rank: int) -> list[int]:
    """Two steps of this rank's samples (ranks 0-2 hold 16 or more), its own length distribution."""
    return rank_lengths(rank, seed=4)[: 2 * STEP]


def _openrlhf_call(rank: int, world: int, group: Any, defect: Optional[str]) -> dict[str, Any]:
    import torch

    from seqbal.integrations.openrlhf import setup_dynamic_batch

    lengths = openrlhf_lengths(rank)
    if defect == "over_cap":
        lengths[0] = CAP + 1
    items = [NS(total_length=torch.tensor([n]), action_mask=torch.ones(1, max(1, n // 2), dtype=torch.bool)) for n in lengths]
    if defect == "total_length_2d":
        items[5].total_length = torch.tensor([lengths[5], 3])
    if defect == "action_mask_none":
        items[2].action_mask = None
    args = NS(
        train=NS(batch_size=STEP * world, max_tokens_per_gpu=CAP),
        rollout=NS(batch_size=STEP * world, n_samples_per_prompt=2),
        ds=NS(ring_attn_size=1, tensor_parallel_size=1),
    )
    strategy = NS(args=args, ds_device_mesh={"dp": NS(get_group=lambda: group)})
    buffer = NS(items=items)
    setup_dynamic_batch(buffer, strategy)
    return {
        "lengths": lengths,
        "indices": buffer.dynamic_indices,
        "optimizer_step": buffer.dynamic_optimizer_step,
        "num_tokens": buffer.dynamic_batch_num_tokens,
    }


def _verl_call(rank: int, group: Any, defect: Optional[str]) -> dict[str, Any]:
    import numpy as np

    from seqbal.integrations.verl import prepare_dynamic_batch

    lengths = rank_lengths(rank, seed=5)
    meta_info: dict[str, Any] = {"step": 1}
    if defect == "meta_lock":
        meta_info["lock"] = threading.Lock()
    data = FakeDataProto(_make_batch(lengths, "dense", seed=rank), {"uid": np.arange(len(lengths))}, meta_info)
    micro_batches, parts = prepare_dynamic_batch(data, max_token_len=CAP, dp_group=group)
    return {
        "lengths": lengths,
        "indices": parts,
        "uids": [mb.non_tensor_batch["uid"].tolist() for mb in micro_batches],
        "meta_copied": all(mb.meta_info == meta_info and mb.meta_info is not meta_info for mb in micro_batches),
    }


def _areal_call(rank: int, group: Any, defect: Optional[str]) -> dict[str, Any]:
    from seqbal.integrations.areal import allocate_balanced_mbs_synced

    lengths = rank_lengths(rank, seed=6)
    spec = NS(n_mbs=1, n_mbs_divisor=1) if defect == "spec_without_cap" else NS(max_tokens_per_mb=CAP, n_mbs=1, n_mbs_divisor=1)
    return {"lengths": lengths, "indices": allocate_balanced_mbs_synced(spec, lengths, group=group)}


def _run_one(scenario: AdapterScenario, rank: int, world: int, group: Any) -> dict[str, Any]:
    defect = scenario.defect if rank == scenario.bad_rank else None
    record: dict[str, Any] = {"name": scenario.name, "rank": rank}
    started = time.monotonic()
    try:
        if scenario.adapter == "verl":
            record.update(_verl_call(rank, group, defect))
        elif scenario.adapter == "openrlhf":
            record.update(_openrlhf_call(rank, world, group, defect))
        else:
            record.update(_areal_call(rank, group, defect))
        record["outcome"] = "ok"
    except Exception as error:  # noqa: BLE001 - every outcome is data for the parent
        record.update(outcome="error", error_type=type(error).__name__, is_value_error=isinstance(error, ValueError),
                      message=str(error), traceback=traceback.format_exc(limit=8))
    record["elapsed_s"] = time.monotonic() - started
    return record


def worker_main(rank: int, world: int, store_port: int, out_dir: str) -> None:
    """One spawned rank: every scenario on a fresh gloo group, one record each."""

    def run(store: Any, write: Any) -> None:
        for scenario in build_scenarios(world):
            group = _scenario_group("world", world, "gloo", SCENARIO_TIMEOUT_S)
            write(_run_one(scenario, rank, world, group))
            meet_again(store, f"seqbal-adapters/{scenario.name}", rank, world)

    serve_scenarios(rank, world, "gloo", store_port, out_dir, run)
