"""Dummy micro-batches through verl 0.9.1's own code, on 2 gloo ranks, one of them short.

With seqbal installed, verl's ``prepare_dynamic_batch`` (the DataProto route) takes
``dummy_micro_batches=True`` and hands it to seqbal; verl's ``restore_dynamic_batch`` and the
engine's ``postprocess_batch_func`` (which concatenates every micro-batch's jagged outputs and
restores them) drop the dummies' rows. Skipped where verl is not installed.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from .invariants import assert_plan_invariants
from .test_verl_engine import data_proto, engine_batch, needs_verl

CAP = 24
SAMPLES = (8, 2)  # rank 1 is short at CAP


def _rank(rank, world, init_file, out_dir):
    """One rank: records what verl's callers returned; never asserts (peers must not hang)."""
    from datetime import timedelta

    import numpy as np
    import torch.distributed as dist
    from tests.process_group import close_process_group
    import verl.utils.seqlen_balancing as verl_balancing
    import verl.workers.engine.utils as engine_utils
    from verl.protocol import DataProto

    from seqbal.integrations import verl as seqbal_verl

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    seqbal_verl.install()
    records = {}
    group = dist.group.WORLD
    # The DataProto route: verl's module name, seqbal's function, the flag passed through.
    data = data_proto(SAMPLES[rank], seed=rank)
    micro_batches, indices = verl_balancing.prepare_dynamic_batch(
        data, max_token_len=CAP, dp_group=group, dummy_micro_batches=True
    )
    restored = verl_balancing.restore_dynamic_batch(DataProto.concat(micro_batches), indices)
    records["dataproto"] = {
        "lengths": data.batch["attention_mask"].sum(-1).tolist(),
        "indices": indices,
        "uids": [mb.non_tensor_batch["uid"].tolist() for mb in micro_batches],
        "classes": sorted({type(mb).__name__ for mb in micro_batches}),
        "dummy_ids": [mb.batch["input_ids"].tolist() for mb, part in zip(micro_batches, indices) if not part],
        "ids": data.batch["input_ids"].tolist(),
        "restored_equal": bool(torch.equal(restored.batch["input_ids"], data.batch["input_ids"])),
        "restored_uids": restored.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist(),
        "meta_kept": micro_batches[-1].meta_info == data.meta_info,
    }
    # The engine's restore: verl's postprocess_batch_func on no-padding (jagged) micro-batches.
    batch = engine_batch(CAP, seed=rank)
    if rank == 1:  # a short rank; tensordict 0.8 cannot slice jagged entries, seqbal's selection can
        from seqbal.tensordict_compat import select_rows

        batch = select_rows(batch, [0, 1])
    lengths = batch["input_ids"].offsets().diff().tolist()
    micro_batches, indices = verl_balancing.rearrange_micro_batches(
        batch, max_token_len=CAP, dp_group=group, dummy_micro_batches=True
    )
    outputs = []
    for micro_batch in micro_batches:
        log_probs = torch.nested.as_nested_tensor(
            [row.float() / 2 for row in micro_batch["input_ids"].unbind()], layout=torch.jagged
        )
        outputs.append({"model_output": {"log_probs": log_probs}, "loss": torch.tensor(1.0), "metrics": {}})
    result = engine_utils.postprocess_batch_func(outputs, indices, batch)
    rows = batch["input_ids"].unbind()
    records["engine"] = {
        "lengths": lengths,
        "indices": indices,
        "restored_equal": all(
            torch.equal(got, row.float() / 2) for got, row in zip(result["model_output"]["log_probs"].unbind(), rows)
        ),
        "restored_rows": len(result["model_output"]["log_probs"].unbind()),
    }
    seqbal_verl.uninstall()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(records, handle, default=lambda value: np.asarray(value).tolist())
    close_process_group()


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    from .test_distributed import spawn_ranks

    out = tmp_path_factory.mktemp("verl_dummies")
    exit_codes = spawn_ranks([(_rank, 2, (2, str(out / "init"), str(out)))], deadline_s=300)
    assert exit_codes == [[0, 0]]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@needs_verl
def test_verl_prepare_dynamic_batch_passes_dummies_through(records):
    synced = [r["dataproto"] for r in records]
    assert len(synced[0]["indices"]) == len(synced[1]["indices"]) > SAMPLES[1]
    assert_plan_invariants(synced[0]["lengths"], synced[0]["indices"], CAP)
    assert_plan_invariants(synced[1]["lengths"], synced[1]["indices"], CAP, dummy_micro_batches=True)
    short = synced[1]
    assert short["classes"] == ["DataProto"]
    shortest = min(range(SAMPLES[1]), key=lambda i: (short["lengths"][i], i))
    for part, uids in zip(short["indices"], short["uids"]):
        assert uids == ([f"uid-{i}" for i in part] if part else [f"uid-{shortest}"])
    assert short["dummy_ids"] and all(ids == [short["ids"][shortest]] for ids in short["dummy_ids"])
    for record in synced:
        assert record["restored_equal"] and record["restored_uids"] and record["meta_kept"]


@needs_verl
def test_verl_postprocess_batch_func_drops_the_dummies_rows(records):
    engine = [r["engine"] for r in records]
    assert len(engine[0]["indices"]) == len(engine[1]["indices"])
    assert any(part == [] for part in engine[1]["indices"])
    for record in engine:
        assert record["restored_rows"] == len(record["lengths"]) and record["restored_equal"]
        assert_plan_invariants(record["lengths"], record["indices"], CAP, dummy_micro_batches=True)

