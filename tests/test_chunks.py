"""Dataset-scale planning in chunks (issue 29, point 1): the seams' bound, every SPEC guarantee.

The chunk size is lowered here (monkeypatched) so that inputs of a few hundred items are
planned in chunks; what is checked does not depend on the size: the count is at most the
sum of the chunks' own counts and at most a packing of the whole input, its gap above the
plain bound is at most the chunks' own gaps plus one part per seam, and the plan keeps the
cap, every index once, forced groups, the minimum and the divisor, deterministically.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqbal.partition.chunks as chunks
import seqbal.partition.search as search
from seqbal import plan_micro_batches
from seqbal.partition import best_fit_decreasing_partitions, smallest_feasible_partitions
from seqbal.partition.packing import _reserving_fill_partitions
from seqbal.partition.parts import ceildiv
from seqbal.workload import calculate_workload
from tests.invariants import assert_plan_invariants


@pytest.fixture
def small_chunks(monkeypatch):  # the same patch for every example: fine to share
    monkeypatch.setattr(chunks, "CHUNK_ITEMS", 48)
    monkeypatch.setattr(chunks, "MIN_PARTS_PER_CHUNK", 4)
    monkeypatch.setattr(search, "WHOLE_TRY_ITEMS_PER_PART", 8)  # the whole input's try at a few hundred items


@pytest.fixture
def every_chunk_searched(monkeypatch):
    """No early stop on the chunks' trend (search.PROBE_CHUNKS): each chunk is searched until
    the plain bounds alone say the packing wins."""
    monkeypatch.setattr(search, "PROBE_CHUNKS", 10**9)


def _own_counts(tokens: np.ndarray, cap: int, m: int) -> list[tuple[int, int]]:
    """(count, plain bound) of each chunk searched alone, as the chunked search deals them."""
    out = []
    for members in chunks.deal_chunks(tokens, m):
        count, _ = smallest_feasible_partitions(tokens[members], calculate_workload(tokens[members]), cap)
        out.append((count, ceildiv(int(tokens[members].sum()), cap)))
    return out


lengths_strategy = st.tuples(
    st.integers(100, 400),  # items
    st.sampled_from([256, 1000, 4096]),  # cap
    st.integers(0, 2**31 - 1),  # seed
    st.sampled_from(["uniform", "small", "third", "tiny", "over_half"]),
)


def _lengths(n: int, cap: int, seed: int, shape: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if shape == "uniform":
        return rng.integers(1, cap + 1, n).astype(np.int64)
    if shape == "small":
        return rng.integers(1, cap // 4 + 1, n).astype(np.int64)
    if shape == "tiny":  # many per part, each at most cap / 10: where the whole input is tried at its bound
        return rng.integers(cap // 50, cap // 10 + 1, n).astype(np.int64)
    if shape == "over_half":  # one per part: the chunks' balance has nothing to do
        return rng.integers(cap // 2 + 1, cap + 1, n).astype(np.int64)
    return rng.integers(cap * 1160 // 4096, cap * 1570 // 4096 + 1, n).astype(np.int64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths_strategy)
def test_seams_cost_at_most_one_part_each(small_chunks, every_chunk_searched, case):
    n, cap, seed, shape = case
    tokens = _lengths(n, cap, seed, shape)
    work = calculate_workload(tokens)
    m = chunks.chunk_count(n, ceildiv(int(tokens.sum()), cap))
    count, parts = smallest_feasible_partitions(tokens, work, cap)
    assert len(parts) == count
    assert sorted(i for p in parts for i in p) == list(range(n)) and all(parts)
    assert all(int(tokens[p].sum()) <= cap for p in parts)
    if m == 1:
        return
    own = _own_counts(tokens, cap, m)
    assert count <= sum(c for c, _ in own)  # never worse than the chunks side by side
    packing = min(len(best_fit_decreasing_partitions(tokens, cap)), len(_reserving_fill_partitions(tokens, cap)))
    assert count <= packing  # nor than a packing of the whole input, which has no seam
    # The gap above the plain bound: the chunks' own gaps plus one part per seam.
    plain = ceildiv(int(tokens.sum()), cap)
    assert count - plain <= sum(c - b for c, b in own) + (m - 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths_strategy, st.sampled_from([1, 2, 4]), st.sampled_from([None, 2, 3]), st.sampled_from([None, 50, 120]))
def test_chunked_plans_keep_every_guarantee(small_chunks, case, group, divisor, minimum):
    n, cap, seed, shape = case
    n -= n % group
    lengths = _lengths(n, cap // group, seed, shape)  # a forced group fits under the cap
    kwargs = dict(force_group_size=group, num_batches_divided_by=divisor, min_num_micro_batch=minimum)
    try:
        parts = plan_micro_batches(lengths, cap, **kwargs)
    except ValueError as error:  # only when the minimum or divisor asks for more parts than groups
        assert "Cannot satisfy" in str(error)
        return
    assert_plan_invariants(lengths, parts, cap, **kwargs)
    assert plan_micro_batches(lengths, cap, **kwargs) == parts  # deterministic
    if group == 1 and divisor is None and minimum is None:  # with the trend's early stop too
        packing = min(len(best_fit_decreasing_partitions(lengths, cap)), len(_reserving_fill_partitions(lengths, cap)))
        assert len(parts) <= packing


def test_chunks_are_dealt_evenly():
    tokens = np.random.default_rng(5).integers(1, 4096, 1001)
    dealt = chunks.deal_chunks(tokens, 7)
    assert sorted(np.concatenate(dealt).tolist()) == list(range(1001))
    assert {len(d) for d in dealt} <= {143}
    assert all((np.diff(d) > 0).all() for d in dealt)
    totals = [int(tokens[d].sum()) for d in dealt]
    assert max(totals) - min(totals) <= int(tokens.max())  # a snake deal: within one item


def test_chunk_count_defaults():
    assert chunks.chunk_count(65536, 10**5) == 1  # where issue 29 measures from: one search
    assert chunks.chunk_count(65537, 10**5) == 3
    assert chunks.chunk_count(40000, 10**5) == 1  # two chunks would cost more than one search
    assert chunks.chunk_count(10**6, 3 * 10**5) == 31
    assert chunks.chunk_count(10**6, 3000) == 11  # few parts: fewer chunks, each of 256 parts or more
    assert chunks.chunk_count(10**6, 300) == 1


@pytest.mark.parametrize("n", [30, 400])  # one search; chunks (with the patch: 400 items > 3 x 48)
def test_progress_reports_every_item_once(small_chunks, n):
    """The count search reports its finished items to a watcher (seqbal plan's progress bar):
    every item exactly once in all, in several steps where it plans in chunks, none outside."""
    from seqbal.partition.progress import watching

    tokens = _lengths(n, 1000, 5, "third")
    seen: list[int] = []
    with watching(seen.append):
        smallest_feasible_partitions(tokens, calculate_workload(tokens), 1000)
    assert sum(seen) == n
    assert (len(seen) > 2) == (n == 400), seen
    smallest_feasible_partitions(tokens, calculate_workload(tokens), 1000)
    assert sum(seen) == n  # nobody watches the second call


@pytest.mark.parametrize("seed", [0, 3, 7, 45])
def test_whole_input_tried_at_its_bound_where_the_seams_alone_lose(small_chunks, monkeypatch, seed):
    """Small items, many per part, a packing one or two parts above the bound: the chunks lose
    to the packing by their seams, and the whole input's one try at its bound lands on it
    (search._seams_only). Without that try the plan is the packing's count."""
    from seqbal.partition import packing_lower_bound

    rng = np.random.default_rng(seed)
    low = int(rng.integers(30, 90))
    tokens = rng.integers(low, min(low + int(rng.integers(5, 40)), 125) + 1, int(rng.integers(300, 500)))
    work = calculate_workload(tokens)
    cap, bound = 1000, packing_lower_bound(tokens, 1000)
    packing = min(len(best_fit_decreasing_partitions(tokens, cap)), len(_reserving_fill_partitions(tokens, cap)))
    assert chunks.chunk_count(len(tokens), ceildiv(int(tokens.sum()), cap)) > 1 and packing > bound
    count, parts = smallest_feasible_partitions(tokens, work, cap)
    assert count == len(parts) == bound
    assert sorted(i for p in parts for i in p) == list(range(len(tokens))) and all(parts)
    assert all(int(tokens[p].sum()) <= cap for p in parts)
    monkeypatch.setattr(search, "WHOLE_TRY_ITEM_FRACTION", 10**9)  # no item is that small: no whole try
    assert smallest_feasible_partitions(tokens, work, cap)[0] == packing


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_off_during_a_search_and_back_as_it_was(monkeypatch, enabled):
    import gc

    seen = []
    packer = search._best_fit_decreasing
    monkeypatch.setattr(search, "_best_fit_decreasing", lambda *a: seen.append(gc.isenabled()) or packer(*a))
    tokens = _lengths(300, 1000, 3, "uniform")
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        smallest_feasible_partitions(tokens, calculate_workload(tokens), 1000)
        assert gc.isenabled() == enabled
        monkeypatch.setattr(search, "_best_fit_decreasing", lambda *a: 1 / 0)
        with pytest.raises(ZeroDivisionError):  # an error inside leaves it as it was too
            smallest_feasible_partitions(tokens, calculate_workload(tokens), 1000)
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen and not any(seen)


def test_chunks_that_only_repack_stop_after_the_probes(small_chunks, monkeypatch):
    """Where every chunk searched so far landed on its own packing above its bound (no try
    found fewer parts), the rest are not searched: they would only re-pack, and the whole
    input's packing has no seams. Each chunk's search is replaced by its own reserving fill
    here, and the whole input is packed by best-fit decreasing alone, which near a third of
    the cap needs more parts: by the chunks' trend they would win, and are still stopped."""
    calls = []
    whole_packing = best_fit_decreasing_partitions
    monkeypatch.setattr(search, "_reserving_fill_partitions", lambda tokens, cap: whole_packing(tokens, cap))

    def own_packing(tokens, work, cap, min_count, step, hint_gap=None):
        calls.append(len(tokens))
        packing = _reserving_fill_partitions(tokens, cap)
        return len(packing), packing, None

    monkeypatch.setattr(search, "_count_search", own_packing)
    tokens = _lengths(600, 1000, 0, "third")
    count, parts = smallest_feasible_partitions(tokens, calculate_workload(tokens), 1000)
    assert len(calls) == search.PROBE_CHUNKS
    assert count == len(parts) == len(whole_packing(tokens, 1000))
    assert sorted(i for p in parts for i in p) == list(range(600)) and all(int(tokens[p].sum()) <= 1000 for p in parts)


@pytest.mark.parametrize("shape", ["uniform", "small", "third", "tiny"])
@pytest.mark.parametrize("seed", [1, 2])
def test_chunks_past_the_thorough_size_probe_their_hint_before_they_pack(monkeypatch, shape, seed):
    """Chunks of more than search.THOROUGH_ITEMS items try their hint before their own
    packings (skipped where it works): the plan keeps every guarantee and stays within a
    packing of the whole input."""
    monkeypatch.setattr(chunks, "CHUNK_ITEMS", 300)
    monkeypatch.setattr(chunks, "MIN_PARTS_PER_CHUNK", 4)
    hints = []
    search_count = search._count_search
    monkeypatch.setattr(search, "_count_search", lambda *a: hints.append(a[-1]) or search_count(*a))
    lengths = _lengths(1200, 4096, seed, shape)
    parts = plan_micro_batches(lengths, 4096)
    assert_plan_invariants(lengths, parts, 4096)
    assert len(hints) <= 4 and (len(hints) < 2 or hints[1] is not None)  # chunks after the first have a hint
    packing = min(len(best_fit_decreasing_partitions(lengths, 4096)), len(_reserving_fill_partitions(lengths, 4096)))
    assert len(parts) <= packing
    assert plan_micro_batches(lengths, 4096) == parts


@pytest.mark.parametrize("seed", range(6))
def test_many_items_per_part_are_packed_by_the_fill_alone(small_chunks, monkeypatch, seed):
    """Where parts hold many items (search.FILL_ALONE_ITEMS_PER_PART, lowered here), the whole
    input is packed by the reserving fill alone, never by best-fit decreasing, and the count
    is at most the fill's."""
    monkeypatch.setattr(search, "FILL_ALONE_ITEMS_PER_PART", 8)
    packed = []
    packer = search._best_fit_decreasing
    monkeypatch.setattr(search, "_best_fit_decreasing", lambda *a: packed.append(len(a[0])) or packer(*a))
    tokens = _lengths(400, 1000, seed, "tiny")
    count, parts = smallest_feasible_partitions(tokens, calculate_workload(tokens), 1000)
    assert count == len(parts) <= len(_reserving_fill_partitions(tokens, 1000))
    assert all(int(tokens[p].sum()) <= 1000 for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(400))
    assert 400 not in packed  # the whole input was not packed by best-fit decreasing
