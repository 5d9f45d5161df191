"""Sync mode in one process: a one-rank gloo group (no spawn), for the paths that need a
process group but no peer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict

from seqbal import MicroBatchPlanError, plan_micro_batches, rearrange_micro_batches


class _UnreadableLengths:
    """Lengths whose conversion to an array raises something seqbal does not expect."""

    def __array__(self, *args, **kwargs):
        raise AttributeError("no lengths here")


def test_unexpected_reading_error_becomes_a_value_error_in_sync_mode(world_of_one):
    with pytest.raises(ValueError, match="the batch could not be read: AttributeError: no lengths here") as info:
        plan_micro_batches(_UnreadableLengths(), 8, dp_group=world_of_one)
    assert isinstance(info.value.__cause__, AttributeError)


def test_unexpected_reading_error_is_left_alone_without_sync():
    with pytest.raises(AttributeError):
        plan_micro_batches(_UnreadableLengths(), 8)


@pytest.fixture
def all_reduce_calls(monkeypatch):
    """Counts torch.distributed.all_reduce calls made through seqbal.collectives."""
    calls = []
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.clone())
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", counting)
    return calls


@pytest.mark.parametrize("group", ["world", 0])
def test_dp_group_that_is_not_a_group_raises_before_any_collective(world_of_one, all_reduce_calls, group):
    """With a process group up, a string or int dp_group used to reach torch.distributed
    (``AttributeError ... 'size'``); now it is a ValueError on this rank, before any collective."""
    with pytest.raises(ValueError, match=r"dp_group must be None or a torch\.distributed ProcessGroup"):
        plan_micro_batches([1, 2, 3], 8, dp_group=group)
    assert all_reduce_calls == []


def test_unindexable_batch_is_agreed_in_the_first_all_reduce(world_of_one, all_reduce_calls):
    """A TensorDict without a batch dimension plans (its mask has rows) but cannot be indexed:
    it must be reported inside the first all-reduce, not raised after the agreement."""
    batch = TensorDict({"attention_mask": torch.ones(3, 4, dtype=torch.long)}, batch_size=[])
    with pytest.raises(ValueError, match=r"batch must have a batch dimension .* got batch_size \[\]"):
        rearrange_micro_batches(batch, 8, dp_group=world_of_one)
    assert len(all_reduce_calls) == 1
    error_entry = all_reduce_calls[0].tolist()[3]  # error_code * world + rank, as sent
    assert error_entry == MicroBatchPlanError.BAD_BATCH


def test_numpy_scalar_arguments_in_sync_mode(world_of_one):
    """NumPy scalars are converted before they are packed into the all-reduce."""
    lengths = [5] * 12
    synced = plan_micro_batches(lengths, np.int16(100), dp_group=world_of_one, num_batches_divided_by=np.uint32(2))
    assert synced == plan_micro_batches(lengths, 100, num_batches_divided_by=2)


def test_cap_beyond_int64_is_an_argument_error_in_sync_mode(world_of_one):
    with pytest.raises(ValueError, match=r"max_token_len=9223372036854775808 is too large"):
        plan_micro_batches([1, 2], 2**63, dp_group=world_of_one)


def test_sync_with_one_rank_equals_no_sync(world_of_one):
    lengths = [5, 9, 3, 7, 1, 8, 2, 6]
    assert plan_micro_batches(lengths, 12, dp_group=world_of_one) == plan_micro_batches(lengths, 12)
