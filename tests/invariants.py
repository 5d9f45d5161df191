"""One checker of every guarantee SPEC makes for a plan, shared by all tests.

Each test supplies a new input; the checks live here once, so a guarantee added to SPEC is
added to every test at the same time.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def ceildiv(a: int, b: int) -> int:
    return -(a // -b)


def assert_plan_invariants(
    lengths: Sequence[int],
    parts: Sequence[Sequence[int]],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
) -> None:
    """Assert every guarantee of SPEC's "Public API" section for one returned plan."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    flat = [i for part in parts for i in part]
    # every sample exactly once, no empty micro-batch, ascending indices
    assert sorted(flat) == list(range(n)), f"indices are not a permutation of range({n})"
    for position, part in enumerate(parts):
        assert len(part) > 0, f"micro-batch {position} is empty"
        assert list(part) == sorted(part), f"micro-batch {position} indices not ascending: {part}"
    # hard cap
    for position, part in enumerate(parts):
        tokens = int(lengths[list(part)].sum())
        assert tokens <= max_token_len, f"micro-batch {position} has {tokens} tokens > cap {max_token_len}"
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
    assert count >= ceildiv(int(lengths.sum()), max_token_len), "count below the ceildiv lower bound"
    if min_num_micro_batch is not None:
        assert count >= min_num_micro_batch, f"count {count} < min_num_micro_batch {min_num_micro_batch}"
    if num_batches_divided_by is not None:
        assert count % num_batches_divided_by == 0, f"count {count} not a multiple of {num_batches_divided_by}"
