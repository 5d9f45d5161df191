"""Sync mode in one process: a one-rank gloo group (no spawn), for the paths that need a
process group but no peer."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from seqbal import plan_micro_batches, rearrange_micro_batches


@pytest.fixture
def world_of_one():
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_unexpected_reading_error_becomes_a_value_error_in_sync_mode(world_of_one):
    with pytest.raises(ValueError, match="the batch could not be read: AttributeError") as info:
        rearrange_micro_batches(object(), 8, dp_group=world_of_one)
    assert isinstance(info.value.__cause__, AttributeError)


def test_unexpected_reading_error_is_left_alone_without_sync():
    with pytest.raises(AttributeError):
        rearrange_micro_batches(object(), 8)


def test_sync_with_one_rank_equals_no_sync(world_of_one):
    lengths = [5, 9, 3, 7, 1, 8, 2, 6]
    assert plan_micro_batches(lengths, 12, dp_group=world_of_one) == plan_micro_batches(lengths, 12)
