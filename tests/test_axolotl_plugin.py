"""The axolotl plug-in's parts that need no axolotl: the cap it reads from the config, and the
global stream of packed rows that accelerate's round-robin deal turns into each rank's own plan.
The real runs are in tests/test_axolotl.py (axolotl's own CI environment)."""

from __future__ import annotations

import pytest

from seqbal.integrations import axolotl as seqbal_axolotl

LENGTHS = [5, 3, 7, 2, 8, 1, 9, 4, 6, 6, 2, 3, 11, 1, 5, 7, 8, 2]


def test_the_cap_is_micro_batch_size_times_sequence_len_unless_set():
    assert seqbal_axolotl.micro_batch_cap({"micro_batch_size": 2, "sequence_len": 64}) == 128
    assert seqbal_axolotl.micro_batch_cap({"micro_batch_size": 2, "sequence_len": 64, "seqbal_max_token_len": 100}) == 100
    with pytest.raises(ValueError, match="sequence_len to be a positive int, got None"):
        seqbal_axolotl.micro_batch_cap({"micro_batch_size": 2})
    with pytest.raises(ValueError, match="seqbal_max_token_len must be a positive int, got 0"):
        seqbal_axolotl.micro_batch_cap({"seqbal_max_token_len": 0})


@pytest.mark.parametrize("world", [1, 2, 3])
def test_accelerates_deal_of_the_stream_is_each_ranks_plan(world):
    """axolotl hands the batch sampler to accelerate, which keeps item j on rank j % world
    (``BatchSamplerShard``, ``even_batches=False``): every rank must get exactly its own rows."""
    shard = pytest.importorskip("accelerate.data_loader").BatchSamplerShard
    stream = seqbal_axolotl._GlobalStream(LENGTHS, 16, num_replicas=world, rank=0, seed=3,
                                          gradient_accumulation_steps=2, max_samples_per_micro_batch=3)
    plan = stream.epoch_plan()
    assert len(stream) == world * len(plan[0]) and len(plan[0]) % 2 == 0
    for rank in range(world):
        dealt = shard(stream, num_processes=world, process_index=rank, split_batches=False, even_batches=False)
        rows = [item for item in dealt]
        assert len(dealt) == len(plan[0]) and rows == [[row] for row in plan[rank]]
        assert all(sum(LENGTHS[i] for i in row[0]) <= 16 and len(row[0]) <= 3 for row in rows)
    stream.set_epoch(1)
    assert stream.epoch_plan() != plan  # a fresh mix every epoch


def test_the_plugin_class_needs_axolotl_only_when_looked_up():
    import importlib.util

    assert seqbal_axolotl.PLUGIN == "seqbal.integrations.axolotl.SeqbalPlugin"
    if importlib.util.find_spec("axolotl") is None:
        with pytest.raises(ImportError):
            seqbal_axolotl.SeqbalPlugin
    else:
        from axolotl.integrations.base import BasePlugin, load_plugin

        plugin = load_plugin(seqbal_axolotl.PLUGIN)  # axolotl's own loader, as for plugins: in the YAML
        assert isinstance(plugin, BasePlugin) and plugin.get_input_args() == "seqbal.integrations.axolotl.SeqbalArgs"


BALANCE_LABELS = r"balance_labels: true asks axolotl to balance supervised tokens .* set balance_labels: false"


def test_balance_labels_with_sample_packing_is_refused_before_the_trainer_is_touched():
    """axolotl 0.21's label balancing lives in its packing sampler, which the plug-in replaces:
    the two together are an error naming balance_labels, not a silent loss of the balancing."""
    cfg = {"sample_packing": True, "balance_labels": True, "micro_batch_size": 2, "sequence_len": 64}
    with pytest.raises(ValueError, match=BALANCE_LABELS):
        seqbal_axolotl.enable(object(), cfg)  # raises before it reads the trainer
    # without packing (or when streaming) the plug-in does nothing, and axolotl balances as usual
    assert seqbal_axolotl.enable(object(), {**cfg, "sample_packing": False}) == {}
    assert seqbal_axolotl.enable(object(), {**cfg, "pretraining_dataset": "stream"}) == {}
    seqbal_axolotl.refuse_balance_labels({**cfg, "balance_labels": False})


def test_the_config_schema_refuses_balance_labels_when_axolotl_validates_it():
    """The plug-in's config model is merged into axolotl's schema: its check runs at validation,
    on the merged config's fields, before any model is loaded."""
    pydantic = pytest.importorskip("pydantic")
    args = seqbal_axolotl.SeqbalArgs

    class Merged(args):  # what axolotl's merge does: its schema with the plug-ins' models as bases
        sample_packing: bool = False
        balance_labels: bool = False

    assert Merged(sample_packing=True).sample_packing
    with pytest.raises(pydantic.ValidationError, match=BALANCE_LABELS):
        Merged(sample_packing=True, balance_labels=True)
    assert Merged(balance_labels=True).balance_labels  # no packing: axolotl's own balancing stays


def test_the_micro_batch_order_is_read_and_checked_from_the_config():
    """``seqbal_micro_batch_order`` reaches the sampler the plug-in binds, and a bad value is refused
    when axolotl validates the config (and by ``enable``), naming it, before the trainer is touched."""
    from types import SimpleNamespace as NS

    pydantic = pytest.importorskip("pydantic")
    cfg = {"sample_packing": True, "micro_batch_size": 1, "sequence_len": 16, "seqbal_token_mean_loss": False,
           "gradient_accumulation_steps": 4}
    trainer = NS(compute_loss_func=None, model=None, args=NS(max_steps=10), _get_train_sampler=None)
    assert seqbal_axolotl.enable(trainer, cfg)["micro_batch_order"] is None  # the sampler's own order
    assert seqbal_axolotl.enable(trainer, {**cfg, "seqbal_micro_batch_order": "largest_first"})["micro_batch_order"] \
        == "largest_first"
    with pytest.raises(ValueError, match="seqbal_micro_batch_order must be one of 'pipeline', 'largest_first', got 'small'"):
        seqbal_axolotl.enable(object(), {**cfg, "seqbal_micro_batch_order": "small"})
    with pytest.raises(pydantic.ValidationError, match="got 'small'"):
        seqbal_axolotl.SeqbalArgs(seqbal_micro_batch_order="small")
    assert seqbal_axolotl.SeqbalArgs(seqbal_micro_batch_order="pipeline").seqbal_micro_batch_order == "pipeline"
    stream = seqbal_axolotl._GlobalStream(LENGTHS, 16, num_replicas=2, rank=0, seed=3, gradient_accumulation_steps=2,
                                          micro_batch_order="largest_first")
    items = [sum(LENGTHS[i] for i in row[0]) for row in stream]  # slot by slot, rank by rank
    slot_largest = [max(items[j:j + 2]) for j in range(0, len(items), 2)]
    for start in range(0, len(slot_largest), 2):  # within every optimizer step: the largest slot first
        assert slot_largest[start:start + 2] == sorted(slot_largest[start:start + 2], reverse=True)


def test_balance_labels_on_axolotls_own_config_object():
    """The same refusal on the DictDefault axolotl hands plug-ins, with the key set as axolotl 0.21's
    validated config carries it (axolotl 0.19.0's own schema has no balance_labels and drops the key
    from a YAML config, so under 0.19.0 the setting never reaches a trainer at all)."""
    DictDefault = pytest.importorskip("axolotl.utils.dict").DictDefault
    cfg = DictDefault({"sample_packing": True, "balance_labels": True, "micro_batch_size": 1, "sequence_len": 32})
    with pytest.raises(ValueError, match=BALANCE_LABELS):
        seqbal_axolotl.enable(object(), cfg)
    seqbal_axolotl.refuse_balance_labels(DictDefault({"sample_packing": True}))  # unset: a DictDefault's None
