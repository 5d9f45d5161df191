"""AReaL 1.0.4's own ``split_padded_tensor_dict_into_mb_list``, alone and with seqbal installed by
``seqbal.integrations.areal``, on 2 gloo ranks with a hard deadline. AReaL alone is not run on
the over-cap case: its rank 0 raises and rank 1 waits in ``all_gather_object`` until the
timeout (the hang needs no test). Skipped, with the reason, where AReaL is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest

from seqbal.integrations import areal as seqbal_areal

from .invariants import assert_plan_invariants
from .test_openrlhf import CAP, shipped_steps

try:
    import torch

    import areal.utils.data as areal_data
    from areal.api.cli_args import MicroBatchSpec
except Exception as error:  # noqa: BLE001 - any import failure means "no usable AReaL here"
    AREAL_MISSING = f"AReaL does not import here ({type(error).__name__}: {error})"
else:
    AREAL_MISSING = None

needs_areal = pytest.mark.skipif(AREAL_MISSING is not None, reason=AREAL_MISSING or "")


def padded(lengths):
    width = max(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"attention_mask": mask, "input_ids": mask * 7}


def indices_of(mb_list):
    """The micro-batches' sample indices: AReaL's forward order, cut at each micro-batch's rows."""
    order, start, parts = list(map(int, mb_list.forward_indices)), 0, []
    for mb in mb_list.mbs:
        rows = mb["attention_mask"].shape[0]
        parts.append(order[start : start + rows])
        start += rows
    return parts


def cases(rank):
    """Per case: this rank's lengths and the MicroBatchSpec fields."""
    return {
        "shipped": (shipped_steps()[rank], {}),
        "uneven": ([3000] * 8 if rank == 0 else [50] * 8, {}),
        "n_mbs_3": ([100] * 8, {"n_mbs": 3}),
        "n_mbs_divisor_4": ([1500] * 7 if rank == 0 else [100] * 8, {"n_mbs_divisor": 4}),
        "rank0_sample_over_cap": ([5000] + [100] * 7 if rank == 0 else [100] * 8, {}),
    }


def _areal_rank(rank, world, init_file, out_dir):
    from datetime import timedelta

    import torch.distributed as dist
    from tests.process_group import close_process_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    records = {}
    for mode in ("areal", "seqbal", "largest_first", "orders_differ"):
        if mode == "seqbal":
            seqbal_areal.install()
        elif mode == "largest_first":
            seqbal_areal.install(micro_batch_order="largest_first")
        elif mode == "orders_differ":  # rank 1 runs the pipeline order: every rank must refuse
            seqbal_areal.install(micro_batch_order="largest_first" if rank == 0 else "pipeline")
        for name, (lengths, spec) in cases(rank).items():
            if mode == "areal" and name == "rank0_sample_over_cap":
                continue  # AReaL alone hangs here
            try:
                mb_list = areal_data.split_padded_tensor_dict_into_mb_list(
                    padded(lengths), MicroBatchSpec(max_tokens_per_mb=CAP, **spec)
                )
                records[f"{mode}/{name}"] = {"lengths": lengths, "indices": indices_of(mb_list)}
            except ValueError as error:
                records[f"{mode}/{name}"] = {"error": str(error)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(records, handle)
    close_process_group()


@pytest.fixture(scope="module")
def areal_records(tmp_path_factory):
    from .test_distributed import spawn_ranks

    out = tmp_path_factory.mktemp("areal")
    assert spawn_ranks([(_areal_rank, 2, (2, str(out / "init"), str(out)))], deadline_s=300) == [[0, 0]]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


EXPECT = {"shipped": {}, "uneven": {}, "n_mbs_3": {"min_num_micro_batch": 3}, "n_mbs_divisor_4": {"num_batches_divided_by": 4}}


@needs_areal
@pytest.mark.parametrize("mode", ["areal", "seqbal", "largest_first"])
@pytest.mark.parametrize("case", sorted(EXPECT))
def test_split_holds_the_cap_with_equal_counts(areal_records, mode, case):
    records = [r[f"{mode}/{case}"] for r in areal_records]
    assert len(records[0]["indices"]) == len(records[1]["indices"])
    for record in records:
        assert_plan_invariants(record["lengths"], record["indices"], CAP, **EXPECT[case])
        if mode == "seqbal":
            assert record["indices"] == sorted(record["indices"])  # AReaL's order: sorted lists
        if mode == "largest_first":  # AReaL runs them in this order: the most tokens first
            tokens = [sum(record["lengths"][i] for i in part) for part in record["indices"]]
            assert tokens == sorted(tokens, reverse=True), tokens


@needs_areal
def test_ranks_that_install_different_orders_all_refuse(areal_records):
    errors = [r["orders_differ/shipped"].get("error", "") for r in areal_records]
    assert errors[0] == errors[1] and "micro_batch_order from 'pipeline' to 'largest_first'" in errors[0], errors


@needs_areal
def test_seqbal_split_over_cap_on_one_rank_raises_on_both(areal_records):
    errors = [r["seqbal/rank0_sample_over_cap"].get("error", "") for r in areal_records]
    assert "exceeds max_token_len" in errors[0], errors
    assert "rank 0 of the data-parallel group failed" in errors[1], errors


@needs_areal
def test_install_reaches_the_splitter_and_uninstall_restores_it():
    original = areal_data.allocate_balanced_mbs_synced
    copy = type(sys)("copies_areals_function")
    copy.allocate_balanced_mbs_synced = original
    sys.modules["copies_areals_function"] = copy
    try:
        assert ("areal.utils.data", "allocate_balanced_mbs_synced") in seqbal_areal.install()
        assert areal_data.allocate_balanced_mbs_synced.__wrapped__ is seqbal_areal.allocate_balanced_mbs_synced
        assert copy.allocate_balanced_mbs_synced is areal_data.allocate_balanced_mbs_synced
        mb_list = areal_data.split_padded_tensor_dict_into_mb_list(padded([3000, 3000, 1000]), MicroBatchSpec(max_tokens_per_mb=CAP))
        assert indices_of(mb_list) == [[0], [1, 2]]  # sorted lists, each within the cap
    finally:
        seqbal_areal.uninstall()
        sys.modules.pop("copies_areals_function")
    assert areal_data.allocate_balanced_mbs_synced is original and copy.allocate_balanced_mbs_synced is original


def test_install_without_areal_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, seqbal_areal.AREAL_MODULE, None)
    with pytest.raises(ImportError, match="needs AReaL"):
        seqbal_areal.install()
    assert not seqbal_areal.is_installed()


def _order_rank(rank, world, init_file, out_dir):
    """One plan per order pair through the adapter's function, as the installed wrapper calls it."""
    from datetime import timedelta

    import torch.distributed as dist
    from tests.process_group import close_process_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    spec = NS(max_tokens_per_mb=CAP, n_mbs=1, n_mbs_divisor=1)
    lengths = shipped_steps()[rank]
    records = {"lengths": lengths}
    for name, order in (("largest_first", "largest_first"), ("pipeline", "pipeline"), ("default", None),
                        ("differ", "largest_first" if rank == 0 else "pipeline")):
        try:
            records[name] = {"indices": seqbal_areal.allocate_balanced_mbs_synced(spec, lengths, micro_batch_order=order)}
        except ValueError as error:
            records[name] = {"error": str(error)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(records, handle)
    close_process_group()


def test_the_order_reaches_every_ranks_plan_and_is_agreed(tmp_path):
    from .test_distributed import spawn_ranks

    assert spawn_ranks([(_order_rank, 2, (2, str(tmp_path / "init"), str(tmp_path)))], deadline_s=300) == [[0, 0]]
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for record in records:
        lengths = record["lengths"]
        tokens = {name: [sum(lengths[i] for i in part) for part in record[name]["indices"]]
                  for name in ("largest_first", "pipeline", "default")}
        assert tokens["largest_first"] == sorted(tokens["largest_first"], reverse=True)
        assert record["default"]["indices"] == sorted(record["default"]["indices"])  # AReaL's own order
        assert sorted(map(sorted, record["pipeline"]["indices"])) == sorted(record["largest_first"]["indices"])
        for name in tokens:
            assert_plan_invariants(lengths, record[name]["indices"], CAP)
    assert records[0]["pipeline"]["indices"] != records[0]["largest_first"]["indices"]  # the order has teeth here
    errors = [r["differ"].get("error", "") for r in records]
    assert errors[0] == errors[1] and "micro_batch_order from 'pipeline' to 'largest_first'" in errors[0], errors


def test_install_forwards_the_order_and_refuses_a_bad_one(monkeypatch):
    fake = type(sys)(seqbal_areal.AREAL_MODULE)
    fake.allocate_balanced_mbs_synced = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, seqbal_areal.AREAL_MODULE, fake)
    lengths = [10, 60, 30, 50, 20, 40]
    spec = NS(max_tokens_per_mb=60, n_mbs=1, n_mbs_divisor=1)
    with seqbal_areal.installed(micro_batch_order="largest_first"):
        parts = fake.allocate_balanced_mbs_synced(spec, lengths)
        assert fake.allocate_balanced_mbs_synced(spec, lengths, micro_batch_order=None) == sorted(parts)
    tokens = [sum(lengths[i] for i in part) for part in parts]
    assert tokens == sorted(tokens, reverse=True) and parts != sorted(parts)
    with seqbal_areal.installed():
        assert fake.allocate_balanced_mbs_synced(spec, lengths) == sorted(parts)  # AReaL's order by default
    with pytest.raises(ValueError, match="got 'smallest_first'"):
        seqbal_areal.install(micro_batch_order="smallest_first")
    assert not seqbal_areal.is_installed()


def test_local_plan_maps_the_spec():
    spec = NS(max_tokens_per_mb=10, n_mbs=3, n_mbs_divisor=2)
    parts = seqbal_areal.allocate_balanced_mbs_synced(spec, [5, 3, 7, 2, 6, 4])
    assert_plan_invariants([5, 3, 7, 2, 6, 4], parts, 10, min_num_micro_batch=3, num_batches_divided_by=2)
    assert parts == sorted(parts)


def test_importing_the_adapter_imports_neither_areal_nor_torch():
    code = "import sys; import seqbal.integrations.areal\nprint(sorted(m for m in ('areal', 'torch') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
