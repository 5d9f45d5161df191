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
