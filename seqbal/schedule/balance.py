"""Balancing a batch over ranks: the driver-side split, no micro-batching.

:func:`balance_batch` only splits the batch over ranks (balanced workload, uid groups kept
together); each worker then micro-batches its share itself with ``rearrange_micro_batches``.
:func:`get_group_balanced_partitions` is the same split on verl's argument names.
"""

from __future__ import annotations

from typing import Any, Hashable, Optional, Sequence

import numpy as np

from ..metrics import log_seqlen_unbalance
from ..partition import karmarkar_karp
from ..validation import int_argument, int_array
from .inputs import WorkloadFn, _groups, _lengths_array, _workloads


def balance_batch(
    lengths: Sequence[int],
    dp_size: int,
    *,
    equal_size: bool = True,
    group_ids: Optional[Sequence[Hashable]] = None,
    workload_fn: Optional[WorkloadFn] = None,
) -> tuple[list[list[int]], dict[str, Any]]:
    """Split a batch over ``dp_size`` ranks with balanced workload (KK), groups kept together.

    Args:
        lengths: effective tokens of each sample.
        dp_size: number of ranks, >= 1.
        equal_size: every rank gets the same number of samples (of groups, with ``group_ids``).
            Default True, as verl's trainer balance does.
        group_ids: one hashable per sample; equal ids go to the same rank (the n responses of one
            GRPO prompt). Default None: every sample is its own group.
        workload_fn: lengths -> workloads (default :func:`seqbal.calculate_workload`).

    Returns:
        ``(partitions, metrics)``: ``dp_size`` ascending index lists (in descending order of
        workload), and :func:`seqbal.log_seqlen_unbalance` of the token counts with prefix
        ``global_seqlen`` (contiguous equal slices "before", these partitions "balanced").

    Raises:
        ValueError: bad arguments, fewer groups than ranks, or ``equal_size`` with a group count
            not divisible by ``dp_size`` (the message gives the numbers).

    Complexity: O(n + g dp log dp) for g groups.

    Examples:
        >>> parts, metrics = balance_batch([8, 7, 1, 2], dp_size=2)
        >>> parts, metrics["global_seqlen/max"], metrics["global_seqlen/balanced_max"]
        ([[0, 2], [1, 3]], 15, 9)
    """
    array = _lengths_array(lengths)
    dp_size = int_argument("dp_size", dp_size)
    groups = _groups(len(array), 1, group_ids)
    work = _workloads(array, workload_fn)
    what = "uid groups" if group_ids is not None else "samples"
    if len(groups) < dp_size:
        raise ValueError(f"{len(groups)} {what} cannot be split over dp_size={dp_size} ranks: need at least {dp_size}")
    if equal_size and len(groups) % dp_size:
        raise ValueError(
            f"{len(groups)} {what} cannot be split evenly over dp_size={dp_size} ranks "
            f"({len(groups)} % {dp_size} = {len(groups) % dp_size}): pass equal_size=False or a batch whose "
            f"number of {what} is a multiple of dp_size"
        )
    group_work = np.array([int(work[g].sum()) for g in groups], dtype=np.int64)
    group_parts = karmarkar_karp(group_work, dp_size, equal_size=equal_size)
    partitions = [sorted(i for g in part for i in groups[g]) for part in group_parts]
    return partitions, log_seqlen_unbalance(array.tolist(), partitions, prefix="global_seqlen")


def get_group_balanced_partitions(
    seqlen_list: Sequence[int], uid_list: Sequence[Hashable], k_partitions: int
) -> list[list[int]]:
    """Split samples over ``k_partitions`` ranks, samples with the same uid kept together.

    A thin wrapper of :func:`balance_batch` with ``equal_size=True``: groups are formed by uid
    value (they need not be contiguous) and each partition gets the same number of groups,
    balanced on workload with KK, as verl does for ``rollout.n`` responses per prompt.

    Complexity: O(n + g k log k) for g groups.

    Raises:
        ValueError: lengths and uids of different sizes, fewer groups than partitions, or a
            group count not divisible by ``k_partitions``.

    Examples:
        >>> get_group_balanced_partitions([5, 5, 1, 1], ["a", "a", "b", "b"], 2)
        [[0, 1], [2, 3]]
    """
    seqlen_list = int_array(seqlen_list, "seqlen_list", sums=False)  # before len(): a 0-d array has none
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"seqlen_list has {len(seqlen_list)} entries but uid_list has {len(uid_list)}")
    return balance_batch(seqlen_list, k_partitions, equal_size=True, group_ids=uid_list)[0]
