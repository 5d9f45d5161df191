"""Every ``install()`` that balances forwards its ``workload_fn`` (and ``micro_batch_order`` where
the trainer's micro-batches are ordered) to the plans it makes, and ``uninstall()`` forgets it.

Each test calls the trainer's own entry point where this environment has the trainer (verl),
and otherwise stands the patched owner in with a small fake of the same shape (the adapters
patch by attribute, so a fake module or class receives exactly what the trainer would); the
adapters' tests against the real trainers run in their own environments (.ci/run).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import numpy as np
import pytest

#: Sequences are what costs: a plan on this model has micro-batches of equal sample counts.
PER_SEQUENCE = lambda s: np.full(len(s), 1000, dtype=np.int64)  # noqa: E731
#: 90 tokens and nine of 10 under a cap of 200 in 2 micro-batches: tokens balance as 1 + 9
#: samples, sequences as 5 + 5.
LENGTHS = [90] + [10] * 9


def _counts(parts):
    return sorted(len(part) for part in parts if part)


def test_verl_install_forwards_to_rearrange_and_prepare_dynamic_batch():
    seqlen_balancing = pytest.importorskip("verl.utils.seqlen_balancing")
    import torch
    from tensordict import TensorDict

    from seqbal.integrations import verl as seqbal_verl

    mask = (torch.arange(90)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    batch = TensorDict({"attention_mask": mask, "input_ids": mask}, batch_size=[len(LENGTHS)])
    data = NS(batch=batch, non_tensor_batch={}, meta_info={})
    try:
        seqbal_verl.install(workload_fn=PER_SEQUENCE, micro_batch_order="largest_first")
        _, indices = seqlen_balancing.rearrange_micro_batches(batch, max_token_len=200, min_num_micro_batch=2)
        assert _counts(indices) == [5, 5]
        assert [sum(LENGTHS[i] for i in p) for p in indices] == sorted((sum(LENGTHS[i] for i in p) for p in indices),
                                                                         reverse=True)
        _, indices = seqlen_balancing.prepare_dynamic_batch(
            types.SimpleNamespace(**vars(data)), max_token_len=200, min_num_micro_batch=2)
        assert _counts(indices) == [5, 5]
        # the caller's own argument wins over install()'s
        _, indices = seqlen_balancing.rearrange_micro_batches(batch, max_token_len=200, min_num_micro_batch=2,
                                                               workload_fn=None)
        assert _counts(indices) == [1, 9]
    finally:
        seqbal_verl.uninstall()
    with seqbal_verl.installed():
        _, indices = seqlen_balancing.rearrange_micro_batches(batch, max_token_len=200, min_num_micro_batch=2)
        assert _counts(indices) == [1, 9]  # uninstall forgot the model


@pytest.mark.parametrize("install", ["verl", "openrlhf", "torchtitan", "llamafactory", "areal"])
def test_a_bad_setting_is_refused_at_install_with_nothing_installed(install):
    import importlib

    module = importlib.import_module(f"seqbal.integrations.{install}")
    with pytest.raises(ValueError, match="negative workload|workload_fn must be"):
        module.install(workload_fn=lambda s: -s - 1)
    with pytest.raises(ValueError, match="'pipeline', 'largest_first', got 'smallest_first'"):
        module.install(micro_batch_order="smallest_first")
    assert not module.is_installed()


def _fake_module(monkeypatch, name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_areal_install_forwards_the_model_to_its_splitter(monkeypatch):
    from seqbal.integrations import areal as seqbal_areal

    fake = _fake_module(monkeypatch, seqbal_areal.AREAL_MODULE, allocate_balanced_mbs_synced=lambda *a, **k: None)
    spec = NS(max_tokens_per_mb=200, n_mbs=2, n_mbs_divisor=1)
    with seqbal_areal.installed(workload_fn=PER_SEQUENCE):
        assert _counts(fake.allocate_balanced_mbs_synced(spec, LENGTHS)) == [5, 5]
    with seqbal_areal.installed():
        assert _counts(fake.allocate_balanced_mbs_synced(spec, LENGTHS)) == [1, 9]


def test_openrlhf_install_forwards_to_both_plans(monkeypatch):
    from seqbal.integrations import openrlhf as seqbal_openrlhf

    calls = []

    class Buffer:
        def setup_dynamic_batch(self, strategy):
            raise AssertionError("OpenRLHF's own method ran")

    class Maker:
        def split_rollout_samples(self, samples):
            raise AssertionError("OpenRLHF's own method ran")

    fakes = {seqbal_openrlhf.REPLAY_BUFFER_MODULE: NS(NaiveReplayBuffer=Buffer),
             seqbal_openrlhf.EXPERIENCE_MAKER_MODULE: NS(RemoteExperienceMaker=Maker, Experience=None)}
    monkeypatch.setattr(seqbal_openrlhf, "_import", fakes.__getitem__)
    monkeypatch.setattr(seqbal_openrlhf, "_wrappers", {})  # wrappers of the spy below, made at install
    monkeypatch.setattr(seqbal_openrlhf, "setup_dynamic_batch", lambda *args, **kwargs: calls.append(kwargs))

    def split(lengths, cap, actors, *, workload_fn=None):
        calls.append(seqbal_openrlhf.assign_to_actors([[0], [1]], [1, 9], 2, workload_fn=workload_fn))
        calls.append(workload_fn)
        return []

    monkeypatch.setattr(seqbal_openrlhf, "plan_rollout_split", split)
    args = NS(train=NS(dynamic_batch_enable=True), rollout=NS(max_tokens_per_gpu=100),
              ds=NS(ring_attn_size=1, tensor_parallel_size=1), actor=NS(num_nodes=1, num_gpus_per_node=2))
    with seqbal_openrlhf.installed(workload_fn=PER_SEQUENCE, micro_batch_order="largest_first"):
        Buffer().setup_dynamic_batch(NS())
        maker = Maker()
        maker.args, maker.tokenizer = args, NS(pad_token_id=0)
        assert maker.split_rollout_samples([NS(total_length=np.array(5)), NS(total_length=np.array(7))]) == []
    assert calls[0] == {"workload_fn": PER_SEQUENCE, "micro_batch_order": "largest_first"}
    assert calls[2] is PER_SEQUENCE  # the rollout split balances the model too (it keeps its own order)
    assert seqbal_openrlhf._settings[0].workload_fn is None  # uninstall forgot it


def test_plan_rollout_split_balances_the_actors_on_the_model():
    from seqbal.integrations.openrlhf import assign_to_actors

    parts = [[0], [1], [2], [3]]
    lengths = [1000, 10, 900, 20]
    default = assign_to_actors(parts, lengths, 2)
    counted = assign_to_actors(parts, lengths, 2, workload_fn=lambda s: np.where(s < 100, 10**9, 1))
    assert default != counted


def test_torchtitan_install_forwards_to_the_grid():
    from seqbal.integrations import torchtitan as seqbal_torchtitan

    class Batcher:
        seq_len, local_batch_size, _dp_degree = 200, 1, 2

        def num_tokens_to_pack(self, sample):
            return sample

        def _assign_training_samples_to_rows(self, samples):
            raise AssertionError("torchtitan's own method ran")

        def _build_microbatch_grid(self, rows):
            raise AssertionError("torchtitan's own method ran")

    lengths = [150] + [10] * 15  # two rows: 150 tokens each (1 + 15 samples), or 6 + 10 samples
    with seqbal_torchtitan.installed(Batcher, workload_fn=PER_SEQUENCE):
        rows = Batcher()._assign_training_samples_to_rows(lengths)
    with seqbal_torchtitan.installed(Batcher):
        default_rows = Batcher()._assign_training_samples_to_rows(lengths)
    assert max(map(len, rows)) - min(map(len, rows)) < max(map(len, default_rows)) - min(map(len, default_rows))
    with seqbal_torchtitan.installed(Batcher, micro_batch_order="largest_first"):
        rows = Batcher()._assign_training_samples_to_rows(np.random.default_rng(0).integers(1, 200, 40).tolist())
    slot_max = [max(sum(rows[2 * m]), sum(rows[2 * m + 1])) for m in range(len(rows) // 2)]  # 2 ranks a slot
    assert slot_max == sorted(slot_max, reverse=True)


def test_sampler_for_trainer_forwards_the_model_to_the_sampler():
    from seqbal import TokenBudgetBatchSampler
    from seqbal.integrations.trl import sampler_for_trainer

    class Sampler(TokenBudgetBatchSampler):
        pass

    trainer = type("Trainer", (), {})()  # the sampler keeps a weak reference to it
    trainer.args = NS(world_size=1, process_index=0, data_seed=None, seed=0, gradient_accumulation_steps=1)
    sampler = sampler_for_trainer(Sampler, trainer, LENGTHS, 200, workload_fn=PER_SEQUENCE)
    assert sampler.workload_fn is PER_SEQUENCE and sampler.micro_batch_order is None
    assert sampler._items.workloads.tolist() == [1000.0] * len(LENGTHS)
    trainer.args.gradient_accumulation_steps = 4
    lengths = [40, 190, 10, 120, 70, 160, 30, 100, 150, 20, 60, 180]
    sampler = sampler_for_trainer(Sampler, trainer, lengths, 200, micro_batch_order="largest_first")
    assert sampler.micro_batch_order == "largest_first"
    tokens = [sum(lengths[i] for i in mb) for mb in sampler]
    for start in range(0, len(tokens), 4):  # every optimizer step: its largest micro-batch first
        assert tokens[start:start + 4] == sorted(tokens[start:start + 4], reverse=True)


def test_trl_and_classic_llamafactory_install_keep_the_model_for_their_sampler(monkeypatch):
    from seqbal.integrations import trl as seqbal_trl

    trainer_module = _fake_module(monkeypatch, seqbal_trl.TRAINER_MODULE, Trainer=type("Trainer", (), {
        "_get_train_sampler": lambda self, train_dataset=None: None}))
    _fake_module(monkeypatch, "transformers.trainer_pt_utils", BatchRebalanceSampler=object)
    with seqbal_trl.installed(64, workload_fn=PER_SEQUENCE, micro_batch_order="largest_first"):
        assert seqbal_trl._settings["workload_fn"] is PER_SEQUENCE
        assert seqbal_trl._settings["micro_batch_order"] == "largest_first"
        assert vars(trainer_module.Trainer)["_get_train_sampler"] is seqbal_trl._get_train_sampler
    assert "workload_fn" not in seqbal_trl._settings and "micro_batch_order" not in seqbal_trl._settings
    with seqbal_trl.installed(64):
        assert seqbal_trl._settings["micro_batch_order"] is None  # the sampler's own random order
    with pytest.raises(ValueError, match="negative workload"):
        seqbal_trl.install(64, workload_fn=lambda s: -s - 1)
    with pytest.raises(ValueError, match="got 'smallest_first'"):
        seqbal_trl.install(64, micro_batch_order="smallest_first")
    assert not seqbal_trl.is_installed()


def test_axolotl_reads_the_model_from_its_config():
    from seqbal.integrations.axolotl import enable, workload_fn_setting
    from seqbal.workload import calculate_workload

    assert workload_fn_setting(None) is None
    assert workload_fn_setting("seqbal.workload:calculate_workload") is calculate_workload
    assert workload_fn_setting("seqbal.workload.calculate_workload") is calculate_workload
    with pytest.raises(ValueError, match="seqbal_workload_fn='seqbal.nowhere:f' does not import"):
        workload_fn_setting("seqbal.nowhere:f")
    with pytest.raises(ValueError, match="seqbal_workload_fn: .*negative"):
        workload_fn_setting(lambda s: -s - 1)
    trainer = NS(compute_loss_func=None, model=None, args=NS(max_steps=10), _get_train_sampler=None)
    cfg = {"sample_packing": True, "micro_batch_size": 1, "sequence_len": 200,
           "seqbal_workload_fn": "seqbal.workload:calculate_workload", "seqbal_token_mean_loss": False}
    assert enable(trainer, cfg)["workload_fn"] is calculate_workload


def test_transfer_queue_sampler_forwards_both_to_its_planners():
    from seqbal.integrations.transfer_queue import StepSampler

    sampler = StepSampler(2, 2, max_token_len=200, workload_fn=PER_SEQUENCE, micro_batch_order="largest_first")
    planner = sampler._planner(("p", "t"), 4)
    assert planner.workload_fn is PER_SEQUENCE and planner.micro_batch_order == "largest_first"
    with pytest.raises(ValueError, match="'pipeline', 'largest_first'"):
        StepSampler(micro_batch_order="smallest")


def test_llamafactory_new_trainer_plans_its_steps_with_the_installed_model(monkeypatch):
    from seqbal.integrations import llamafactory as seqbal_llamafactory
    from seqbal.integrations._settings import PlanSettings

    monkeypatch.setattr(seqbal_llamafactory, "_data_parallel", lambda: (None, 0, 2))
    monkeypatch.setattr(seqbal_llamafactory, "_collate", lambda strategy, samples: [len(s["input_ids"]) for s in samples])
    monkeypatch.setitem(seqbal_llamafactory._settings, "max_token_len", 200)
    results = {}
    for name, plan in (("default", PlanSettings()), ("counted", PlanSettings(PER_SEQUENCE, "pipeline"))):
        monkeypatch.setitem(seqbal_llamafactory._settings, "plan", plan)
        samples = [{"input_ids": [0] * n} for n in LENGTHS + LENGTHS]
        buffer = NS(samples=samples, load_state_dict=lambda state: None)
        step = seqbal_llamafactory._generate_batch("dynamic_padding_free", buffer, {"num_micro_batch": 2})
        results[name] = max(map(len, step)) - min(map(len, step))  # this rank's micro-batches' sample counts
    assert results["counted"] < results["default"]
