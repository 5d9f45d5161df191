"""verl's own callers with seqbal installed by ``seqbal.integrations.verl``.

The engine path of verl 0.9.1: a left/right-padded batch turned into a no-padding TensorDict
by verl's ``left_right_2_no_padding`` (jagged ``input_ids``, ``position_ids`` jagged too, of
shape ``(bs, 4, j)`` for mRoPE), verl's ``prepare_micro_batches`` (which calls
``rearrange_micro_batches``), fake per-token model outputs, and verl's ``postprocess_batch_func``
(which calls ``restore_dynamic_batch``). And the DataProto route: ``prepare_dynamic_batch`` and
its restore. Skipped, with the reason, where verl is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import seqbal
from seqbal.integrations import verl as seqbal_verl

from .invariants import assert_plan_invariants

try:  # verl's engine utilities pull ray, transformers, peft, datasets, ...
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import verl.utils.seqlen_balancing as verl_balancing
        import verl.workers.engine.utils as engine_utils
        from verl.protocol import DataProto
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding
except Exception as error:  # noqa: BLE001 - any import failure means "no usable verl here"
    VERL_MISSING = f"verl's engine utilities do not import here ({type(error).__name__}: {error})"
else:
    VERL_MISSING = None

needs_verl = pytest.mark.skipif(VERL_MISSING is not None, reason=VERL_MISSING or "")

PROMPT, RESPONSE = 6, 10


def padded_batch(batch_size=8, mrope=False, seed=0):
    """A left-padded prompt + right-padded response batch, as verl's rollout produces it."""
    from tensordict import TensorDict

    generator = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, PROMPT + 1, (batch_size,), generator=generator)
    response_lens = torch.randint(1, RESPONSE + 1, (batch_size,), generator=generator)
    columns = torch.arange(PROMPT + RESPONSE)
    prompt_mask = (columns[None, :PROMPT] >= PROMPT - prompt_lens[:, None]).long()
    response_mask = (torch.arange(RESPONSE)[None, :] < response_lens[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(1, 1000, attention_mask.shape, generator=generator) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    if mrope:  # (bs, 4, seq): text position plus three rope sections, as Qwen2-VL's processor gives
        position_ids = torch.stack([position_ids + 1000 * k for k in range(4)], dim=1)
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "position_ids": position_ids,
        },
        batch_size=[batch_size],
    )


def engine_batch(cap, mrope=False, force_group_size=1, seed=0):
    data = left_right_2_no_padding(padded_batch(mrope=mrope, seed=seed))
    tu.assign_non_tensor(data, max_token_len_per_gpu=cap, use_dynamic_bsz=True, force_group_size=force_group_size)
    tu.assign_non_tensor(data, uid=[f"uid-{i}" for i in range(len(data))])
    return data


CASES = {
    "nested": dict(cap=24),
    "mrope_position_ids": dict(cap=24, mrope=True),
    "force_group_size_2": dict(cap=32, force_group_size=2),
    "num_batches_divided_by_2": dict(cap=24, num_batches_divided_by=2),
    "tight_cap": dict(cap=None),  # the longest sequence: the tightest cap that can be met
}


def run_engine_path(case):
    """verl's prepare_micro_batches -> fake model -> verl's postprocess_batch_func."""
    options = dict(CASES[case])
    cap = options.pop("cap")
    num_batches_divided_by = options.pop("num_batches_divided_by", None)
    data = engine_batch(cap or 1, **options)
    lengths = data["input_ids"].offsets().diff().tolist()
    if cap is None:
        cap = max(lengths)
        tu.assign_non_tensor(data, max_token_len_per_gpu=cap)
    micro_batches, indices = engine_utils.prepare_micro_batches(data, num_batches_divided_by=num_batches_divided_by)
    outputs = []
    for micro_batch in micro_batches:
        log_probs = torch.nested.as_nested_tensor(
            [row.float() / 2 for row in micro_batch["input_ids"].unbind()], layout=torch.jagged
        )
        outputs.append({"model_output": {"log_probs": log_probs}, "loss": torch.tensor(1.0), "metrics": {"n": len(log_probs)}})
    result = engine_utils.postprocess_batch_func(outputs, indices, data)
    return data, lengths, cap, micro_batches, indices, result, options.get("force_group_size", 1), num_batches_divided_by


def assert_engine_path_correct(data, lengths, cap, micro_batches, indices, result, group, divided_by):
    assert_plan_invariants(lengths, indices, cap, force_group_size=group, num_batches_divided_by=divided_by)
    rows = data["input_ids"].unbind()
    positions = data["position_ids"].unbind()
    uids = data.get("uid").tolist()
    for micro_batch, part in zip(micro_batches, indices):
        assert micro_batch["max_token_len_per_gpu"] == cap
        assert micro_batch.get("uid").tolist() == [uids[i] for i in part]
        assert micro_batch["position_ids"]._ragged_idx == data["position_ids"]._ragged_idx
        for got, i in zip(micro_batch["input_ids"].unbind(), part):
            assert torch.equal(got, rows[i])
        for got, i in zip(micro_batch["position_ids"].unbind(), part):
            assert torch.equal(got, positions[i])
    restored = result["model_output"]["log_probs"]
    assert [len(row) for row in restored.unbind()] == lengths
    for got, row in zip(restored.unbind(), rows):
        assert torch.equal(got, row.float() / 2)
    assert len(result["loss"]) == len(micro_batches)
    assert sum(result["metrics"]["n"]) == len(lengths)


@needs_verl
@pytest.mark.parametrize("case", sorted(CASES))
def test_verl_engine_path_with_seqbal(case):
    with seqbal_verl.installed():
        assert engine_utils.rearrange_micro_batches.__wrapped__ is seqbal.rearrange_micro_batches
        run = run_engine_path(case)
    assert_engine_path_correct(*run)


@needs_verl
@pytest.mark.parametrize("case", sorted(CASES))
def test_verl_engine_path_with_verls_own_implementation(case):
    """The reference: verl's own functions on the same inputs (they must be restored)."""
    assert engine_utils.rearrange_micro_batches.__module__ == "verl.utils.seqlen_balancing"
    assert_engine_path_correct(*run_engine_path(case))


@needs_verl
def test_over_cap_sample_is_a_value_error_in_verl():
    data = engine_batch(cap=3)
    with seqbal_verl.installed():
        with pytest.raises(ValueError, match="exceeds max_token_len"):
            engine_utils.prepare_micro_batches(data)


def data_proto(batch_size=8, seed=0):
    batch = padded_batch(batch_size, seed=seed)
    return DataProto.from_dict(
        tensors=dict(batch.items()),
        non_tensors={"uid": np.array([f"uid-{i}" for i in range(batch_size)], dtype=object)},
        meta_info={"temperature": 0.7, "micro": {"nested": [1, 2]}},
    )


@needs_verl
def test_dataproto_prepare_and_restore_through_verls_module():
    data = data_proto()
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    with seqbal_verl.installed():
        micro_batches, indices = verl_balancing.prepare_dynamic_batch(data, max_token_len=24)
        assert_plan_invariants(lengths, indices, 24)
        for micro_batch, part in zip(micro_batches, indices):
            assert isinstance(micro_batch, DataProto)
            assert micro_batch.meta_info == data.meta_info and micro_batch.meta_info is not data.meta_info
            assert micro_batch.non_tensor_batch["uid"].tolist() == [f"uid-{i}" for i in part]
            assert torch.equal(micro_batch.batch["input_ids"], data.batch["input_ids"][part])
            assert int(micro_batch.batch["attention_mask"].sum()) <= 24
        # Per-sample outputs concatenated in micro-batch order, put back with verl's name.
        values = torch.cat([mb.batch["input_ids"].sum(-1) for mb in micro_batches])
        assert torch.equal(verl_balancing.restore_dynamic_batch(values, indices), data.batch["input_ids"].sum(-1))
        restored = verl_balancing.restore_dynamic_batch(DataProto.concat(micro_batches), indices)
    assert torch.equal(restored.batch["input_ids"], data.batch["input_ids"])
    assert restored.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()


@needs_verl
def test_install_reaches_earlier_and_later_importers_and_uninstall_undoes_both():
    originals = {"rearrange": verl_balancing.rearrange_micro_batches, "restore": verl_balancing.restore_dynamic_batch}
    early = types.ModuleType("early_importer")
    early.rearrange_micro_batches = originals["rearrange"]
    sys.modules["early_importer"] = early
    try:
        mine = types.ModuleType("uses_seqbal_itself")  # a user module: `from seqbal import ...`
        mine.rearrange_micro_batches = seqbal.rearrange_micro_batches
        sys.modules["uses_seqbal_itself"] = mine
        seqbal_verl.install()
        assert early.rearrange_micro_batches.__wrapped__ is seqbal.rearrange_micro_batches
        assert engine_utils.restore_dynamic_batch.__wrapped__ is seqbal_verl.restore_dynamic_batch
        late = types.ModuleType("late_importer")
        late.rearrange_micro_batches = verl_balancing.rearrange_micro_batches  # a `from ... import` after install
        sys.modules["late_importer"] = late
        assert late.rearrange_micro_batches.__wrapped__ is seqbal.rearrange_micro_batches
        seqbal_verl.uninstall()
        for module in (early, late, engine_utils, verl_balancing):
            assert module.rearrange_micro_batches is originals["rearrange"]
        assert engine_utils.restore_dynamic_batch is originals["restore"]
        # uninstall() must not hand verl's function to code that chose seqbal's (it once did, and
        # every later test in the same process then ran verl's function under seqbal's name)
        assert mine.rearrange_micro_batches is seqbal.rearrange_micro_batches
        assert not seqbal_verl.is_installed() and seqbal_verl.uninstall() == []
    finally:
        seqbal_verl.uninstall()
        sys.modules.pop("early_importer", None)
        sys.modules.pop("late_importer", None)
        sys.modules.pop("uses_seqbal_itself", None)


@needs_verl
def test_autoinstall_module_reaches_a_fresh_verl_process():
    """verl imports the modules of VERL_USE_EXTERNAL_MODULES at `import verl` in every process
    (its Ray workers too): there, the engine utilities must bind seqbal's functions."""
    code = "import verl.workers.engine.utils as u; print(u.rearrange_micro_batches.__module__)"
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="seqbal.integrations.verl_autoinstall")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "seqbal.rearrange"


def test_install_without_verl_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "verl.utils.seqlen_balancing", None)  # import fails as if absent
    with pytest.raises(ImportError, match="needs verl"):
        seqbal_verl.install()
    assert not seqbal_verl.is_installed()


def test_dataproto_functions_work_on_any_dataproto_shaped_object():
    """prepare/restore need only batch, non_tensor_batch and meta_info (no verl import)."""
    from dataclasses import dataclass, field

    from tensordict import TensorDict

    @dataclass
    class Proto:
        batch: TensorDict = None
        non_tensor_batch: dict = field(default_factory=dict)
        meta_info: dict = field(default_factory=dict)

        def __len__(self):
            return self.batch.batch_size[0]

    lengths = [5, 3, 7, 2, 6, 4]
    mask = (torch.arange(8)[None, :] < torch.tensor(lengths)[:, None]).long()
    data = Proto(TensorDict({"attention_mask": mask}, batch_size=[6]), {"uid": np.arange(6)}, {"step": 1})
    micro_batches, indices = seqbal_verl.prepare_dynamic_batch(data, max_token_len=10)
    assert_plan_invariants(lengths, indices, 10)
    assert [mb.non_tensor_batch["uid"].tolist() for mb in micro_batches] == indices
    merged = Proto(
        torch.cat([mb.batch for mb in micro_batches]),
        {"uid": np.concatenate([mb.non_tensor_batch["uid"] for mb in micro_batches])},
        {"step": 1},
    )
    restored = seqbal_verl.restore_dynamic_batch(merged, indices)
    assert torch.equal(restored.batch["attention_mask"], mask) and restored.non_tensor_batch["uid"].tolist() == list(range(6))
    with pytest.raises(ValueError, match="data.batch"):
        seqbal_verl.prepare_dynamic_batch(Proto(None, {"uid": np.arange(2)}), max_token_len=4)


def test_importing_the_adapter_imports_neither_verl_nor_torch():
    """verl is imported only when install() runs; the module itself needs only NumPy."""
    code = (
        "import sys; import seqbal.integrations.verl\n"
        "print(sorted(m for m in ('verl', 'torch', 'tensordict') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _engine_rank(rank, world, init_file, out_dir):
    """One data-parallel rank of verl's engine path with seqbal installed (spawned process).
    Records, for each scenario, the plan or the error; never asserts (a wrong rank must still
    join the next collective)."""
    import json
    from datetime import timedelta

    import torch.distributed as dist
    from tests.process_group import close_process_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=20))
    records = {}
    seqbal_verl.install()
    # Same arguments on both ranks (ranks that disagree on the cap get a mismatch error instead):
    # at a cap of 13, rank 0's batch (seed 0) holds a 14-token sample and rank 1's fits.
    for name, cap, divided_by in (("synced", 24, 2), ("rank0_sample_over_cap", 13, None)):
        data = engine_batch(cap, seed=rank)
        lengths = data["input_ids"].offsets().diff().tolist()
        try:
            _, indices = engine_utils.prepare_micro_batches(
                data, dp_group=dist.group.WORLD, num_batches_divided_by=divided_by
            )
            records[name] = {"lengths": lengths, "indices": indices, "cap": cap}
        except ValueError as error:
            records[name] = {"error": str(error)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(records, handle)
    close_process_group()


@needs_verl
def test_verl_engine_path_synced_over_two_gloo_ranks(tmp_path):
    """verl's prepare_micro_batches with a dp_group: equal counts on both ranks, the cap and every
    guarantee on each; a sample over the cap on rank 0 makes both ranks raise, nobody hangs."""
    import json

    from .test_distributed import spawn_ranks

    exit_codes = spawn_ranks([(_engine_rank, 2, (2, str(tmp_path / "init"), str(tmp_path)))], deadline_s=300)
    assert exit_codes == [[0, 0]]
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    synced = [r["synced"] for r in records]
    assert len(synced[0]["indices"]) == len(synced[1]["indices"])
    for record in synced:
        assert_plan_invariants(record["lengths"], record["indices"], record["cap"], num_batches_divided_by=2)
    errors = [r["rank0_sample_over_cap"].get("error", "") for r in records]
    assert "exceeds max_token_len" in errors[0], errors
    assert "rank 0 of the data-parallel group failed" in errors[1], errors
