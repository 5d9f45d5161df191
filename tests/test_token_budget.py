"""TokenBudgetBatchSampler and pack_rows on plain lengths (no trainer needed): every guarantee of
their docstrings, on random lists, and the loss through ``seqbal.loss_weights``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbal import CostModel
from seqbal.integrations.token_budget import TokenBudgetBatchSampler, pack_rows


def all_ranks(lengths, cap, world, **kwargs):
    return [TokenBudgetBatchSampler(lengths, cap, num_replicas=world, rank=r, **kwargs) for r in range(world)]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=8, max_size=120),
    world=st.integers(1, 4),
    ga=st.integers(1, 3),
    padded=st.booleans(),
    epoch=st.integers(0, 5),
)
def test_every_guarantee(lengths, world, ga, padded, epoch):
    cost = CostModel(padded=padded)
    try:
        samplers = all_ranks(lengths, 64, world, gradient_accumulation_steps=ga, cost_model=cost, seed=3)
    except ValueError as error:
        assert "Cannot satisfy" in str(error)  # too few samples for world * ga micro-batches
        return
    counts = {len(s) for s in samplers}
    assert len(counts) == 1 and counts.pop() % ga == 0
    batches = []
    for s in samplers:
        s.set_epoch(epoch)
        mine = list(s)
        assert len(mine) == len(s) and all(mine)
        assert all(cost.cost([lengths[i] for i in mb]) <= 64 for mb in mine)
        batches.extend(mine)
        assert mine == list(s)  # iterating again: the same batches (resume skips a prefix of them)
    assert sorted(itertools.chain.from_iterable(batches)) == list(range(len(lengths)))


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=8, max_size=120),
    world=st.integers(1, 4),
    max_samples=st.integers(1, 6),
    epoch=st.integers(0, 3),
)
def test_the_sample_cap_holds_in_every_epoch(lengths, world, max_samples, epoch):
    try:
        samplers = all_ranks(lengths, 256, world, max_samples_per_micro_batch=max_samples, seed=5)
    except ValueError as error:
        assert "Cannot satisfy" in str(error)  # too few samples for the micro-batches the caps need
        return
    assert len(samplers[0]) * world >= -(-len(lengths) // max_samples)
    batches = []
    for s in samplers:
        s.set_epoch(epoch)
        mine = list(s)
        assert all(0 < len(mb) <= max_samples and sum(lengths[i] for i in mb) <= 256 for mb in mine)
        batches.extend(mine)
    assert sorted(itertools.chain.from_iterable(batches)) == list(range(len(lengths)))


def test_epochs_reshuffle_deterministically_and_slots_stay_aligned():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, 400).tolist()
    a = TokenBudgetBatchSampler(lengths, 128, num_replicas=2, rank=0, seed=1)
    b = TokenBudgetBatchSampler(lengths, 128, num_replicas=2, rank=1, seed=1)
    assert a.epoch_plan(3) == b.epoch_plan(3) == TokenBudgetBatchSampler(lengths, 128, num_replicas=2, rank=0, seed=1).epoch_plan(3)
    assert a.epoch_plan(0) != a.epoch_plan(1)
    assert a.epoch_plan(0) != TokenBudgetBatchSampler(lengths, 128, num_replicas=2, rank=0, seed=2).epoch_plan(0)
    for epoch in (0, 1):  # slot i carries the same workload on every epoch: the shuffle keeps costs
        tokens = sorted(tuple(sum(lengths[i] for i in mb) for mb in slot) for slot in zip(*a.epoch_plan(epoch)))
        assert tokens == sorted(tuple(sum(lengths[i] for i in mb) for mb in slot) for slot in zip(*a.epoch_plan(0)))
    a.set_epoch(1)
    assert list(a) == a.epoch_plan(1)[0]
    unshuffled = TokenBudgetBatchSampler(lengths, 128, num_replicas=2, rank=0, shuffle=False)
    assert unshuffled.epoch_plan(0) == unshuffled.epoch_plan(7)


def test_forced_groups_stay_together_across_epochs():
    lengths = [3, 4, 3, 4, 5, 5, 2, 9, 3, 4, 1, 1]
    sampler = TokenBudgetBatchSampler(lengths, 12, num_replicas=1, rank=0, force_group_size=2)
    for epoch in range(4):
        for mb in sampler.epoch_plan(epoch)[0]:
            assert all((i ^ 1) in mb for i in mb)


def test_an_impossible_cap_names_the_sample_when_built():
    with pytest.raises(ValueError, match=r"sample 2 has 90 tokens, which exceeds max_token_len=64"):
        TokenBudgetBatchSampler([5, 6, 90, 7], 64, num_replicas=2, rank=1)
    with pytest.raises(ValueError, match="rank must be an int in"):
        TokenBudgetBatchSampler([5, 6], 64, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        TokenBudgetBatchSampler([5, 6], 64, num_replicas=1, rank=0, gradient_accumulation_steps=0)


def trl_bfd_count(lengths, seq_length):
    """Best-fit decreasing as TRL's _pack_bfd does it (truncating first), one batch."""
    spaces = []
    for length in sorted((min(x, seq_length) for x in lengths), reverse=True):
        fits = [k for k, s in enumerate(spaces) if s >= length]
        if fits:
            best = min(fits, key=lambda k: spaces[k])
            spaces[best] -= length
        else:
            spaces.append(seq_length - length)
    return len(spaces)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=150))
def test_pack_rows_never_needs_more_rows_than_bfd(lengths):
    rows = pack_rows(lengths, 64)[0]
    assert len(rows) <= trl_bfd_count(lengths, 64)
    assert sorted(itertools.chain.from_iterable(rows)) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)


def test_pack_rows_balances_ranks_and_refuses_to_truncate():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 200, 500).tolist()
    rows = pack_rows(lengths, 512, num_replicas=4)
    assert len({len(r) for r in rows}) == 1
    with pytest.raises(ValueError, match="exceeds max_token_len=512"):
        pack_rows(lengths + [513], 512)


def test_loss_weights_make_the_accumulated_gradient_the_step_token_mean():
    torch = pytest.importorskip("torch")
    from seqbal import loss_weights

    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 30, 60).tolist()
    sampler = TokenBudgetBatchSampler(lengths, 64, num_replicas=1, rank=0, gradient_accumulation_steps=3)
    step = list(sampler)[:3]
    data = {i: torch.tensor(rng.normal(size=(n, 4)), dtype=torch.float64) for i, n in enumerate(lengths)}
    weight = torch.tensor(rng.normal(size=4), dtype=torch.float64, requires_grad=True)
    width = max(lengths)
    micro = []
    for mb in step:
        mask = torch.zeros(len(mb), width)
        for row, i in enumerate(mb):
            mask[row, : lengths[i]] = 1
        micro.append({"response_mask": mask})
    # loss_weights takes each micro-batch's places in the step's batch (the step's samples in
    # order), not the dataset indices the sampler yields
    places, start = [], 0
    for mb in step:
        places.append(list(range(start, start + len(mb))))
        start += len(mb)
    weights = loss_weights(micro, places, dtype=torch.float64)
    tokens = sum(lengths[i] for mb in step for i in mb)
    assert all(torch.equal(w, torch.full_like(w, 1 / tokens)) for w in weights)  # 1/N
    for mb, batch, w in zip(step, micro, weights):
        token_loss = torch.zeros(len(mb), width, dtype=torch.float64)
        for row, i in enumerate(mb):
            token_loss[row, : lengths[i]] = (data[i] @ weight) ** 2
        (token_loss * batch["response_mask"] * w[:, None]).sum().backward()
    accumulated = weight.grad.clone()
    weight.grad = None
    everything = torch.cat([data[i] for mb in step for i in mb])
    ((everything @ weight) ** 2).mean().backward()
    assert torch.allclose(accumulated, weight.grad, rtol=1e-9, atol=0)  # float64 weights: exact
