"""The schedule's inputs: lengths as an int array, per-sample workloads, uid groups, counts.

Shared by every route of the schedule (the aligned one, ``equal_samples``, the padded one) and by
:func:`~seqbal.schedule.balance.balance_batch`, so each argument is read and checked in one
place, before any planning starts. Pure Python/NumPy on plain lengths.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np

from ..validation import group_keys, int_argument, int_array
from ..workload import WorkloadFn, checked_workloads




def raise_if_over(values: np.ndarray, limit: int, message: Callable[[int, int], str]) -> None:
    """``ValueError(message(index, count))`` if any value exceeds ``limit``: ``index`` is the first
    such value's, ``count`` how many there are. Shared by the schedule's checks of samples and
    groups and by the adapters that name their own setting (torchtitan's ``seq_len``). O(n).
    """
    over = np.flatnonzero(values > limit)
    if over.size:
        raise ValueError(message(int(over[0]), int(over.size)))


def _lengths_array(lengths: Any) -> np.ndarray:
    """Lengths as a 1-D int64 array; ValueError on anything else (tensors are accepted)."""
    return int_array(
        lengths, "lengths", samples=True, integral_floats=False, sums=False,
        empty="lengths is empty (0 samples): nothing to schedule",
    )


def _workloads(lengths: np.ndarray, workload_fn: Optional[WorkloadFn]) -> np.ndarray:
    """Checked int64 workloads of ``lengths`` (:func:`seqbal.workload.checked_workloads`)."""
    return checked_workloads(lengths, workload_fn)


def _groups(
    n: int, force_group_size: int, group_ids: Optional[Sequence[Hashable]]
) -> list[list[int]]:
    """Sample indices of every group, groups in order of first appearance, indices ascending."""
    force_group_size = int_argument("force_group_size", force_group_size, expected="an int >= 1")
    if group_ids is not None:
        group_ids = group_keys(group_ids)  # tensors, arrays, 0-d tensors: grouped by value
        if force_group_size != 1:
            raise ValueError(
                f"give either force_group_size (got {force_group_size}) or group_ids, not both: "
                f"set force_group_size=1 when passing group_ids"
            )
        if len(group_ids) != n:
            raise ValueError(f"lengths has {n} entries but group_ids has {len(group_ids)}")
        members: dict[Hashable, list[int]] = {}
        for index, uid in enumerate(group_ids):
            members.setdefault(uid, []).append(index)
        return list(members.values())
    if n % force_group_size:
        raise ValueError(f"force_group_size={force_group_size} does not divide the batch size {n}")
    g = force_group_size
    if g == 1:
        return [[index] for index in range(n)]  # the same lists, at a third of the cost
    return [list(range(start, start + g)) for start in range(0, n, g)]


def _optional_count(name: str, value: Any) -> Optional[int]:
    return int_argument(name, value, optional=True, expected="None or an int >= 1")
