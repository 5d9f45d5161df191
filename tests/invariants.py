"""One checker of every guarantee SPEC makes for a plan, shared by all tests.

Each test supplies a new input; the checks live here once, so a guarantee added to SPEC is
added to every test at the same time.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def ceildiv(a: int, b: int) -> int:
    return -(a // -b)


def micro_batch_cost(lengths: Sequence[int], cost_model=None) -> int:
    """What one micro-batch costs under ``cost_model`` (None, "tokens", "padded" or a CostModel),
    computed here from the definitions, independently of seqbal's own arithmetic."""
    if cost_model is None or cost_model == "tokens":
        padded, round_to, pack_round_to = False, 1, 1
    elif cost_model == "padded":
        padded, round_to, pack_round_to = True, 1, 1
    else:
        padded, round_to, pack_round_to = cost_model.padded, cost_model.round_to, cost_model.pack_round_to
    rounded = [ceildiv(int(s), round_to) * round_to for s in lengths]
    if padded:
        return len(rounded) * max(rounded, default=0)
    return ceildiv(sum(rounded), pack_round_to) * pack_round_to


def assert_plan_invariants(
    lengths: Sequence[int],
    parts: Sequence[Sequence[int]],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    cost_model=None,
    dummy_micro_batches: bool = False,
    max_samples_per_micro_batch: Optional[int] = None,
) -> None:
    """Assert every guarantee of SPEC's "Public API" section for one returned plan.

    ``max_samples_per_micro_batch`` (what the call was given): no micro-batch holds more
    samples, and the count is at least ``ceildiv(groups, max_samples // force_group_size)``.

    ``cost_model`` is what the call was given; the cap is checked on that cost. With
    ``dummy_micro_batches`` (what the call was given) empty index lists are dummies: allowed
    only after every real micro-batch, and only when the real ones are one per forced group
    (a rank holding more groups than the count never gets a dummy); every other guarantee is
    checked on the real micro-batches, the count bounds on the count with the dummies.
    """
    # Arguments may be NumPy scalars (np.int16, np.uint32): check in Python ints, which never wrap.
    max_token_len, force_group_size = int(max_token_len), int(force_group_size)
    num_batches_divided_by = None if num_batches_divided_by is None else int(num_batches_divided_by)
    min_num_micro_batch = None if min_num_micro_batch is None else int(min_num_micro_batch)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    flat = [i for part in parts for i in part]
    # every sample exactly once, no empty micro-batch, ascending indices
    assert sorted(flat) == list(range(n)), f"indices are not a permutation of range({n})"
    real_count = sum(1 for part in parts if len(part))
    if dummy_micro_batches and real_count < len(parts):
        assert all(len(part) for part in parts[:real_count]), "a dummy (empty list) sits before a real micro-batch"
        assert real_count == n // force_group_size, (
            f"{len(parts) - real_count} dummies although the {n // force_group_size} groups fill only {real_count} "
            f"micro-batches: a dummy is for a rank with fewer groups than the count"
        )
    for position, part in enumerate(parts[:real_count] if dummy_micro_batches else parts):
        assert len(part) > 0, f"micro-batch {position} is empty"
        assert list(part) == sorted(part), f"micro-batch {position} indices not ascending: {part}"
    # hard cap, on the cost the call chose
    for position, part in enumerate(parts):
        cost = micro_batch_cost(lengths[list(part)].tolist(), cost_model)
        assert cost <= max_token_len, f"micro-batch {position} costs {cost} > cap {max_token_len} ({cost_model})"
    # forced groups stay together
    if force_group_size > 1:
        where = {}
        for position, part in enumerate(parts):
            for i in part:
                where[i] = position
        for start in range(0, n, force_group_size):
            homes = {where[i] for i in range(start, start + force_group_size)}
            assert len(homes) == 1, f"forced group at {start} split over micro-batches {sorted(homes)}"
    # count bounds
    count = len(parts)
    rounded_total = sum(micro_batch_cost([s], cost_model) for s in lengths.tolist())
    if cost_model is None or cost_model == "tokens" or cost_model == "padded" or cost_model.pack_round_to == 1:
        assert count >= ceildiv(rounded_total, max_token_len), "count below the ceildiv lower bound"
    else:  # packed rounding: each lone sample costs at least itself, so the bound uses raw lengths
        assert count >= ceildiv(int(lengths.sum()), max_token_len), "count below the ceildiv lower bound"
    if min_num_micro_batch is not None:
        assert count >= min_num_micro_batch, f"count {count} < min_num_micro_batch {min_num_micro_batch}"
    if num_batches_divided_by is not None:
        assert count % num_batches_divided_by == 0, f"count {count} not a multiple of {num_batches_divided_by}"
    if max_samples_per_micro_batch is not None:
        _assert_sample_cap(parts, int(max_samples_per_micro_batch), "micro-batch")
        per_part = int(max_samples_per_micro_batch) // force_group_size
        assert count >= ceildiv(n // force_group_size, per_part), (
            f"count {count} below the sample bound ceildiv({n // force_group_size} groups, {per_part} per micro-batch)"
        )


def _assert_sample_cap(parts: Sequence[Sequence[int]], max_samples: int, what: str) -> None:
    """No micro-batch holds more than ``max_samples`` samples."""
    for position, part in enumerate(parts):
        assert len(part) <= max_samples, f"{what} {position} holds {len(part)} samples > max_samples {max_samples}"


def assert_schedule_invariants(
    lengths: Sequence[int],
    schedule,
    max_token_len: int,
    dp_size: int,
    *,
    force_group_size: int = 1,
    group_ids: Optional[Sequence] = None,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    rebuild=None,
    cost_model=None,
    equal_samples: bool = False,
    workloads: Optional[Sequence[int]] = None,
    max_samples_per_micro_batch: Optional[int] = None,
) -> None:
    """Assert every guarantee of ``build_dp_schedule`` (issues 5 and 22) for one returned DPSchedule.

    ``cost_model`` is what the call was given; the cap is checked on that cost.
    ``equal_samples``: every rank must hold the same number of samples.
    ``max_samples_per_micro_batch``: no micro-batch holds more samples, and the total count is
    at least ``ceildiv(n, max_samples)``.
    ``workloads``: the per-sample workloads the schedule was balanced on (default: the
    schedule's own); ``step_efficiency()`` is recomputed from them here and must agree.

    ``rebuild``, if given, is a zero-argument callable that builds the schedule again from the
    same input; the result must be identical (determinism).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    assert schedule.dp_size == dp_size, f"schedule is for {schedule.dp_size} ranks, asked {dp_size}"
    assert schedule.max_token_len == max_token_len
    assert len(schedule.micro_batches) == dp_size and len(schedule.rank_indices) == dp_size
    count = schedule.num_micro_batches
    # the same count on every rank
    for rank, mbs in enumerate(schedule.micro_batches):
        assert len(mbs) == count, f"rank {rank} has {len(mbs)} micro-batches, expected {count}"
    # every sample exactly once; micro-batches non-empty, ascending, within the cap
    flat = [i for rank in schedule.micro_batches for mb in rank for i in mb]
    assert sorted(flat) == list(range(n)), f"indices are not a permutation of range({n})"
    where = {}
    for rank, mbs in enumerate(schedule.micro_batches):
        for position, mb in enumerate(mbs):
            assert len(mb) > 0, f"rank {rank} micro-batch {position} is empty"
            assert list(mb) == sorted(mb), f"rank {rank} micro-batch {position} not ascending: {mb}"
            cost = micro_batch_cost(lengths[list(mb)].tolist(), cost_model)
            assert cost <= max_token_len, f"rank {rank} micro-batch {position} costs {cost} > cap {max_token_len}"
            for i in mb:
                where[i] = (rank, position)
        # per rank, the flattened micro-batches tile its sample list in order
        tiled = tuple(i for mb in mbs for i in mb)
        assert tuple(schedule.rank_indices[rank]) == tiled, f"rank {rank}: rank_indices do not tile its micro-batches"
        local = schedule.local_micro_batches(rank)
        assert [[schedule.rank_indices[rank][p] for p in mb] for mb in local] == [list(mb) for mb in mbs]
    # groups never split
    groups: dict = {}
    if group_ids is not None:
        for i, uid in enumerate(group_ids):
            groups.setdefault(uid, []).append(i)
    elif force_group_size > 1:
        for start in range(0, n, force_group_size):
            groups[start] = list(range(start, start + force_group_size))
    for key, members in groups.items():
        homes = {where[i] for i in members}
        assert len(homes) == 1, f"group {key!r} split over (rank, micro-batch) {sorted(homes)}"
    # count bounds
    total = count * dp_size
    assert total >= ceildiv(int(lengths.sum()), max_token_len), "total count below the ceildiv lower bound"
    if num_batches_divided_by is not None:
        assert count % num_batches_divided_by == 0, f"count {count} not a multiple of {num_batches_divided_by}"
    if min_num_micro_batch is not None:
        assert count >= min_num_micro_batch, f"count {count} < min_num_micro_batch {min_num_micro_batch}"
    if max_samples_per_micro_batch is not None:
        for rank, mbs in enumerate(schedule.micro_batches):
            _assert_sample_cap(mbs, int(max_samples_per_micro_batch), f"rank {rank} micro-batch")
        assert total >= ceildiv(n, int(max_samples_per_micro_batch)), "total count below the sample bound"
    # equal sample counts when asked
    if equal_samples:
        sizes = [len(r) for r in schedule.rank_indices]
        assert len(set(sizes)) == 1, f"equal_samples=True but ranks hold {sizes} samples"
    # step efficiency, recomputed from its definition
    work = np.asarray(schedule.workloads if workloads is None else workloads, dtype=np.float64)
    grid = np.array([[work[list(mb)].sum() for mb in mbs] for mbs in schedule.micro_batches])
    limit = grid.sum() / dp_size
    reported = schedule.step_efficiency()
    if limit > 0:
        expected = {"per_micro_batch": limit / grid.max(axis=0).sum(), "per_step": limit / grid.sum(axis=1).max()}
        for key, value in expected.items():
            assert abs(reported[key] - value) <= 1e-9, f"step_efficiency {key} {reported[key]} != {value}"
    assert 0 < reported["per_micro_batch"] <= reported["per_step"] + 1e-12 <= 1 + 1e-9, reported
    # summary agrees with the schedule
    summary = schedule.summary()
    assert summary["num_micro_batches"] == count and summary["max_tokens"] <= max_token_len
    assert sum(summary["tokens_per_rank"]) == int(lengths.sum())
    # deterministic
    if rebuild is not None:
        assert rebuild() == schedule, "the same input gave a different schedule"
