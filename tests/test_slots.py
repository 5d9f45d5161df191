"""The schedule's aligned slots (seqbal/schedule/slots.py): the slot evening and the rank polish.

Two kinds of checks. Pinned schedules: the evening was made cheaper without changing a single
trade, and these digests (recorded on 849e464, before that work) fail if any trade changes;
they cover the regimes its shortcuts depend on: more than SLOT_PARTNERS + 1 ranks (the
lightest partners of the slot plus the roomiest of other slots), bins of more than
TRADE_ITEMS groups (sampled candidate rows), many slots with small bins, and the swaps-only
evening of ``equal_samples``. An intended change of trades updates them in its own commit,
with benchmarks/plan_hashes.json. Property tests: the stages on random bins keep every group
once, the cap, non-empty bins and exact sums, and never make a step time worse.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqbal.partition.parts import _part_sums
from seqbal.schedule import build_dp_schedule
from seqbal.schedule import slots as slots_module
from seqbal.schedule.slots import SLOT_PARTNERS, TRADE_ITEMS, _Bins, _even_slots, _polish_ranks, _slots_from_bins

from .invariants import assert_schedule_invariants

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import workloads  # noqa: E402

# (family, samples, ranks, cap, equal_samples, digest of micro_batches on 849e464)
PINNED = [
    ("pareto", 4096, 24, 32768, False, "4b21d0f9924169d1"),  # bins of ~57 groups: sampled rows
    ("uniform", 4096, 32, 16384, False, "aad190638d0f5372"),  # 33 slots of bins of ~4 groups
    ("grpo_groups", 2048, 20, 16384, False, "d0aa971a560d5af6"),  # forced groups of 8
    ("lognormal", 2304, 24, 16384, True, "7724b1425dc6f706"),  # swaps only, 24 ranks
    ("pareto", 4000, 20, 8192, False, "1dbfc1f74974913c"),
    ("bimodal_rl", 2048, 8, 4096, False, "aa4202717b4089a0"),  # every bin of the slot a partner
    ("lognormal", 1536, 12, 8192, True, "a827edabde635417"),
]


@pytest.mark.parametrize("family,n,dp,cap,equal_samples,digest", PINNED)
def test_slot_evening_makes_the_recorded_trades(family, n, dp, cap, equal_samples, digest):
    lengths, group = workloads.families()[family](n, cap, workloads.case_seed(family, n, cap))
    schedule = build_dp_schedule(lengths, dp, cap, force_group_size=group, equal_samples=equal_samples)
    assert_schedule_invariants(lengths, schedule, cap, dp, force_group_size=group, equal_samples=equal_samples)
    assert hashlib.sha256(json.dumps(schedule.micro_batches).encode()).hexdigest()[:16] == digest


def test_pinned_cases_reach_the_regimes_they_stand_for():
    assert max(dp for _, _, dp, _, _, _ in PINNED) > SLOT_PARTNERS + 1
    lengths, _ = workloads.families()["pareto"](4096, 32768, workloads.case_seed("pareto", 4096, 32768))
    schedule = build_dp_schedule(lengths, 24, 32768)
    assert max(len(mb) for rank in schedule.micro_batches for mb in rank) > TRADE_ITEMS


@st.composite
def binned(draw):
    """Random groups packed first-fit into bins under a cap, and the bins cut into slots of dp."""
    capacity = draw(st.integers(50, 400))
    sizes = draw(st.lists(st.integers(1, 60), min_size=4, max_size=160))
    tokens = np.minimum(np.asarray(sizes, dtype=np.int64), capacity)
    work = tokens * 97 + tokens**2 + draw(st.integers(0, 3)) * (np.arange(len(tokens)) % 5)
    parts: list[list[int]] = []
    room: list[int] = []
    for g in draw(st.permutations(range(len(tokens)))):
        fit = next((b for b in range(len(parts)) if room[b] >= tokens[g]), None)
        if fit is None:
            parts.append([])
            room.append(capacity)
            fit = len(parts) - 1
        parts[fit].append(g)
        room[fit] -= int(tokens[g])
    dp = draw(st.integers(1, max(1, min(len(parts), 40))))
    while len(parts) % dp:  # whole slots: split a bin of several groups, else a rank fewer
        many = next((b for b in range(len(parts)) if len(parts[b]) > 1), None)
        if many is None:
            dp -= 1
            continue
        parts.append([parts[many].pop()])
    return sorted(sorted(p) for p in parts), tokens, work, capacity, dp


def _check_bins(bins: _Bins, before: list[list[int]], n: int) -> None:
    assert sorted(g for p in bins.parts for g in p) == list(range(n))
    assert all(bins.parts), "a bin was emptied"
    assert (bins.bin_tokens == _part_sums(bins.tokens, bins.parts)).all()
    assert (bins.bin_work == _part_sums(bins.work, bins.parts)).all()
    assert (bins.bin_tokens <= bins.capacity).all()
    if not bins.moves:
        assert [len(p) for p in bins.parts] == [len(p) for p in before], "swaps only must keep every bin's count"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(binned(), st.booleans())
def test_slot_evening_and_rank_polish_keep_every_guarantee(case, moves):
    parts, tokens, work, capacity, dp = case
    bins = _Bins(parts, tokens, work, capacity, moves=moves)
    slots = _slots_from_bins(bins.parts, bins.bin_work, dp)
    step_before = sum(int(bins.bin_work[s].max()) for s in slots)
    _even_slots(bins, slots)
    _check_bins(bins, parts, len(tokens))
    assert bins.parts == [sorted(p) for p in bins.parts]
    maxima = [int(bins.bin_work[s].max()) for s in slots]
    assert sum(maxima) <= step_before, "the evening made the per-micro-batch step slower"
    grid = [list(s) for s in slots]  # one bin per rank in each slot, in slot order
    heaviest_rank = int(bins.bin_work[np.asarray(grid)].sum(axis=0).max())
    evened = [list(p) for p in bins.parts]
    _polish_ranks(bins, grid)
    _check_bins(bins, evened, len(tokens))
    assert all(int(bins.bin_work[s].max()) <= m for s, m in zip(slots, maxima)), "the polish raised a slot's maximum"
    assert int(bins.bin_work[np.asarray(grid)].sum(axis=0).max()) <= heaviest_rank


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(binned(), st.integers(0, 6))
def test_a_trade_budget_bounds_the_evening_and_keeps_the_guarantees(case, budget):
    """``budget`` (what a samples_per_step step passes): at most that many trades, every
    guarantee kept, and the trades made are the first ones of the unbounded evening."""
    parts, tokens, work, capacity, dp = case
    bins = _Bins(parts, tokens, work, capacity, moves=True)
    slots = _slots_from_bins(bins.parts, bins.bin_work, dp)
    step = sum(int(bins.bin_work[s].max()) for s in slots)
    trades: list[tuple[int, int, int]] = []
    exchange = bins.exchange
    bins.exchange = lambda group, source, target: trades.append((group, source, target)) or exchange(group, source, target)
    _even_slots(bins, slots, budget)
    _check_bins(bins, parts, len(tokens))
    assert sum(int(bins.bin_work[s].max()) for s in slots) <= step
    assert len(trades) <= 2 * budget  # a swap is two exchanges
    full = _Bins(parts, tokens, work, capacity, moves=True)
    unbounded: list[tuple[int, int, int]] = []
    exchange_full = full.exchange
    full.exchange = lambda group, source, target: unbounded.append((group, source, target)) or exchange_full(group, source, target)
    _even_slots(full, _slots_from_bins(full.parts, full.bin_work, dp))
    assert unbounded[:len(trades)] == trades


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(binned(), st.sampled_from([1e-6, 1e-4, 1e-2]))
def test_the_stop_relative_to_the_step_keeps_the_guarantees_and_stops_where_it_says(case, fraction):
    """SLOT_MIN_EXCESS (off as shipped; benchmarks.schedule_tradeoff's variants): the same
    guarantees as today's evening; no bin changes where every slot starts within the stop, nor
    at 1.0 (the whole step) whatever the slots."""
    assert slots_module.SLOT_MIN_EXCESS == 0.0, "shipped off: today's evening"
    parts, tokens, work, capacity, dp = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slots_module, "SLOT_MIN_EXCESS", fraction)
        bins = _Bins(parts, tokens, work, capacity, moves=True)
        slots = _slots_from_bins(bins.parts, bins.bin_work, dp)
        step = sum(int(bins.bin_work[s].max()) for s in slots)
        even = [int(bins.bin_work[s].max()) - float(bins.bin_work[s].mean()) <= fraction * step for s in slots]
        _even_slots(bins, slots)
        _check_bins(bins, parts, len(tokens))
        assert sum(int(bins.bin_work[s].max()) for s in slots) <= step
        if all(even):  # no slot is ever searched: nothing may change
            assert bins.parts == parts
        patch.setattr(slots_module, "SLOT_MIN_EXCESS", 1.0)  # every excess is below the whole step
        still = _Bins(parts, tokens, work, capacity, moves=True)
        _even_slots(still, _slots_from_bins(still.parts, still.bin_work, dp))
        assert still.parts == parts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(SLOT_PARTNERS + 2, 48), st.integers(2, 6), st.integers(0, 2**31), st.booleans())
def test_many_ranks_keep_every_schedule_guarantee(dp, per_rank, seed, equal_samples):
    # more ranks than SLOT_PARTNERS + 1: the partners are the slot's lightest and other slots' roomiest
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(5, 1.0, dp * per_rank * 4).astype(np.int64) + 1, 2048)
    schedule = build_dp_schedule(lengths, dp, 2048, equal_samples=equal_samples)
    assert_schedule_invariants(
        lengths, schedule, 2048, dp, equal_samples=equal_samples,
        rebuild=lambda: build_dp_schedule(lengths, dp, 2048, equal_samples=equal_samples),
    )
