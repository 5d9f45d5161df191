"""Arguments that are slightly off, in one process: group ids given as tensors or arrays, a cap
that rounds to no room, a TransferQueue ``dp_rank`` it does not understand, sizes that would
exhaust memory, a bool among lengths, epochs that are not epochs, checkpoints that break the
step planner's promises, NumPy ints in axolotl's config. Each is read by value or refused with
a ``ValueError`` that names the argument, and a refused call changes nothing."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbal import CostModel, StepPlanner, build_dp_schedule
from seqbal.epochs.sampler import TokenBudgetBatchSampler, pack_rows
from seqbal.integrations.axolotl import micro_batch_cap
from seqbal.integrations.transfer_queue import StepSampler
from seqbal.stream.planner import MAX_MICRO_BATCHES_PER_STEP
from seqbal.validation import group_keys


def forms(ids: list[int]) -> dict:
    """The same group ids as every container a caller might pass."""
    return {
        "list": list(ids),
        "array": np.array(ids),
        "tensor": torch.tensor(ids),
        "0-d tensors": [torch.tensor(i) for i in ids],
        "0-d arrays": [np.array(i) for i in ids],
        "numpy scalars": [np.int64(i) for i in ids],
    }


# --- 4. group ids read as their values -------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=24), st.integers(1, 3))
def test_group_ids_in_any_container_plan_as_the_list_does(ids, ranks):
    lengths = [(7 * i) % 23 + 1 for i in range(len(ids))]
    try:
        reference = build_dp_schedule(lengths, ranks, 40, group_ids=list(ids)).micro_batches
    except ValueError as error:
        reference = str(error)
    for name, given_ids in forms(ids).items():
        try:
            got = build_dp_schedule(lengths, ranks, 40, group_ids=given_ids).micro_batches
        except ValueError as error:
            got = str(error)
        assert got == reference, name
        # a cap each group fits alone, tight enough that the groups spread over micro-batches
        cap = max(sum(n for n, g in zip(lengths, ids) if g == gid) for gid in set(ids))
        planner = StepPlanner(cap, ranks, samples_per_step=len(ids))
        planner.add(range(len(ids)), lengths, groups=given_ids)
        step = planner.next_step(flush=True)
        where = {i: (r, m) for r, rank in enumerate(step) for m, mb in enumerate(rank) for i in mb}
        for a in range(len(ids)):
            for b in range(len(ids)):
                if ids[a] == ids[b]:
                    assert where[a] == where[b], f"{name}: group {ids[a]} split"


def test_a_step_planner_keeps_tensor_groups_whole():
    planner = StepPlanner(100, 2, samples_per_step=4)
    planner.add([0, 1, 2, 3], [10, 10, 10, 10], groups=torch.tensor([1, 1, 2, 2]))
    assert planner.next_step() in ([[[0, 1]], [[2, 3]]], [[[2, 3]], [[0, 1]]])
    planner.add([4, 5], [10, 10], groups=[torch.tensor(7), torch.tensor(7)])
    assert planner._pool.group_count == 1


def test_group_keys_refuses_what_is_not_one_id_per_sample():
    with pytest.raises(ValueError, match="a 1-D Tensor"):
        group_keys(torch.tensor(1))
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        group_keys(np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"group_ids\[1\] is \[2\]"):
        group_keys([1, [2]])
    assert group_keys([torch.tensor([1, 2]), (1, 2)]) == [(1, 2), (1, 2)]


def test_transfer_queue_ready_indexes_as_a_tensor_are_read_as_values():
    sampler = StepSampler(n_samples_per_prompt=2, dp_size=1)
    assert sampler.sample(torch.arange(4), 4, dp_rank=0)[0] == [0, 1, 2, 3]
    assert sampler.sample(np.arange(4, 8), 4, dp_rank=0, batch_index=1)[0] == [4, 5, 6, 7]


# --- 5. a cap that rounds to no capacity -----------------------------------------------------


def test_a_cap_that_rounds_to_no_room_is_refused_when_the_planner_is_built():
    with pytest.raises(ValueError, match=r"max_token_len=8 .*pack_round_to=64"):
        StepPlanner(8, 2, micro_batches_per_step=1, cost_model=CostModel(pack_round_to=64))
    with pytest.raises(ValueError, match=r"max_token_len=8 .*pack_round_to=64"):
        StepSampler(dp_size=2, max_token_len=8, cost_model=CostModel(pack_round_to=64))
    StepPlanner(64, 2, micro_batches_per_step=1, cost_model=CostModel(pack_round_to=64))  # room for 64


# --- 6. TransferQueue's dp_rank --------------------------------------------------------------


class Partition:
    def __init__(self, lengths):
        self.lengths = lengths

    def get_custom_meta(self, indexes):
        return {i: {"total_lengths": self.lengths[i]} for i in indexes}


def test_transfer_queue_takes_numpy_ranks_and_refuses_one_out_of_range_before_planning():
    lengths = {i: 10 + i for i in range(8)}
    sampler = StepSampler(n_samples_per_prompt=2, dp_size=np.int64(2), max_token_len=100)
    before = copy.deepcopy(sampler.save_checkpoint())
    for bad in (2, -1, np.int64(5), "0", 0.0, None):
        with pytest.raises(ValueError, match="dp_rank"):
            sampler.sample(list(range(8)), 2, "t", "p", dp_rank=bad, batch_index=0, partition=Partition(lengths))
        assert sampler.save_checkpoint() == before, "a refused call changed the sampler"
    shares = [sampler.sample(list(range(8)), 2, "t", "p", dp_rank=np.int64(r), batch_index=0,
                             partition=Partition(lengths))[0] for r in range(2)]
    assert sorted(shares[0] + shares[1]) == [0, 1, 2, 3] and shares[0] and shares[1]
    # a batch already planned answers a rank beyond it as TransferQueue's own sampler does
    assert sampler.sample(list(range(8)), 2, "t", "p", dp_rank=5, batch_index=0) == ([], [])


# --- 7. sizes, bools, epochs, checkpoints, config ints ---------------------------------------


def test_a_step_of_more_micro_batches_than_a_step_can_hold_is_refused():
    with pytest.raises(ValueError, match=r"micro_batches_per_step=10000000 .*more than a step can hold"):
        StepPlanner(8, 2, micro_batches_per_step=10**7)
    planner = StepPlanner(8, 2, micro_batches_per_step=MAX_MICRO_BATCHES_PER_STEP // 2)
    planner.add([0], [3])
    step = planner.next_step(flush=True)
    assert sum(len(mb) for rank in step for mb in rank) == 1


@pytest.mark.parametrize("lengths", [[True, 3], [3, np.True_], [4, False, 2]])
def test_a_bool_among_lengths_is_refused_everywhere(lengths):
    with pytest.raises(ValueError, match="a bool"):
        StepPlanner(10, 1, micro_batches_per_step=1).add(range(len(lengths)), lengths)
    with pytest.raises(ValueError, match="a bool"):
        TokenBudgetBatchSampler(lengths, 10, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="a bool"):
        pack_rows(lengths, 10)
    with pytest.raises(ValueError, match="a bool"):
        build_dp_schedule(lengths, 1, 10)


@pytest.mark.parametrize("epoch", [-1, "1", 1.7, True, None])
def test_set_epoch_refuses_what_is_not_an_epoch(epoch):
    sampler = TokenBudgetBatchSampler([3, 4, 5, 6], 10, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="set_epoch: epoch must be an int >= 0"):
        sampler.set_epoch(epoch)
    assert sampler.epoch == 0
    sampler.set_epoch(np.int64(2))
    assert sampler.epoch == 2 and isinstance(sampler.epoch, int)
    with pytest.raises(ValueError, match="epoch_plan: epoch must be"):
        sampler.epoch_plan(-1)


def test_the_sampler_refuses_a_rank_out_of_range_alone():
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        TokenBudgetBatchSampler([3, 4, 5, 6], 10, num_replicas=2, rank=2)


def _saved():
    planner = StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3)
    planner.add([1, 2, 3], [4, 5, 6], groups=[0, 0, 1])
    planner.next_step()
    planner.add([7], [2])
    return planner.state_dict()


@pytest.mark.parametrize("change, key", [
    (lambda s: s.pop("steps"), "'steps'"),
    (lambda s: s.update(steps=-2), r"state\['steps'\]"),
    (lambda s: s["pool"].pop("work"), "'work'"),
    (lambda s: s["pool"].update(lengths=[6, 99]), r"state\['pool'\].*99 tokens"),
    (lambda s: s["pool"].update(cost=[1, 1]), r"state\['pool'\]\['cost'\]"),
    (lambda s: s["pool"].update(samples=[1, 2]), r"state\['pool'\]\['samples'\]"),
    (lambda s: s["pool"].update(indices=[7, 7]), r"state\['pool'\].*index 7"),
    (lambda s: s["pool"].update(indices=["a", "b"]), r"state\['pool'\]\['indices'\]"),
    (lambda s: s["pool"].update(born=[0, 9]), r"state\['pool'\]\['born'\]"),
    (lambda s: s.update(steps=9), r"state\['pool'\]\['born'\].*beyond max_wait_steps=3"),
    (lambda s: s.update(pool=[1, 2]), r"state\['pool'\] must be a dict"),
    (lambda s: s.update(witness=[99]), r"state\['witness'\] puts group 0 .* in step 99, outside steps 1 to 3"),
    (lambda s: s.update(witness=[1, 1, 1]), r"state\['witness'\] has 3 entries, but the pool holds 2 groups"),
    (lambda s: s.update(witness=["x"]), r"state\['witness'\]"),
])
def test_a_checkpoint_that_breaks_a_promise_is_refused_naming_the_key(change, key):
    state = _saved()
    change(state)
    planner = StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3)
    planner.add([50], [3])
    with pytest.raises(ValueError, match=key):
        planner.load_state_dict(state)
    assert planner.pending == 1 and planner.steps == 0, "a refused state changed the planner"
    assert planner.next_step() == [[[50]]]


def test_a_deadline_witness_over_the_cap_is_refused_and_one_saved_without_it_is_rebuilt():
    """The witness of max_wait_steps (which step each pending group can still leave in) is part
    of the state: one that packs two groups of 6 tokens into one micro-batch of 10 is refused;
    a state saved before the planner kept one gets one packed afresh, and every group still
    leaves by its deadline."""
    planner = StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3)
    planner.add([1, 2, 3], [6, 6, 6])
    state = planner.state_dict()
    state["witness"] = [1, 1]  # groups 0 and 1 both in step 1's micro-batch: 12 > 10
    with pytest.raises(ValueError, match=r"state\['witness'\] fills micro-batch 0 of step 1 over the cap \(12 > 10"):
        StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3).load_state_dict(state)
    planner.next_step()
    state = planner.state_dict()
    assert len(state["witness"]) == 2
    del state["witness"]
    restored = StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3)
    restored.load_state_dict(state)
    assert [restored.next_step(), restored.next_step(), restored.next_step()] == [[[[2]]], [[[3]]], None]
    packed_too_late = StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3)
    packed_too_late.add([1, 2, 3, 4], [6, 6, 6, 6])
    state = packed_too_late.state_dict()
    state["steps"] = 1  # four groups of 6 that must all leave by step 3: three steps of one micro-batch
    with pytest.raises(ValueError, match=r"cannot all leave by their max_wait_steps=3 deadlines"):
        StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3).load_state_dict(state)


def test_a_checkpoint_over_the_wait_bound_is_refused_and_a_good_one_loads():
    state = _saved()
    loose = StepPlanner(10, 1, micro_batches_per_step=1)
    loose.add([1, 2], [4, 5])
    tight = StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=0)
    with pytest.raises(ValueError, match=r"state\['pool'\]: max_wait_steps=0: the pool would hold 2 groups"):
        tight.load_state_dict(loose.state_dict())
    assert tight.pending == 0
    other_cost = StepPlanner(10, 1, micro_batches_per_step=1, cost_model=CostModel(round_to=4), max_wait_steps=3)
    with pytest.raises(ValueError, match=r"state\['pool'\]\['cost'\] does not match"):
        other_cost.load_state_dict(state)
    planner = StepPlanner(10, 1, micro_batches_per_step=1, max_wait_steps=3)
    planner.load_state_dict(state)
    assert planner.pending == 2 and planner.steps == 1


def test_axolotls_cap_check_takes_numpy_ints():
    assert micro_batch_cap({"micro_batch_size": np.int64(2), "sequence_len": np.int32(1024)}) == 2048
    assert micro_batch_cap({"seqbal_max_token_len": np.uint16(4096)}) == 4096
    assert type(micro_batch_cap({"seqbal_max_token_len": np.int64(7)})) is int
    with pytest.raises(ValueError, match="sequence_len to be a positive int, got True"):
        micro_batch_cap({"micro_batch_size": 2, "sequence_len": True})
