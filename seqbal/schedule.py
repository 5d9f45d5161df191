"""Driver-side planning: splitting a batch over data-parallel ranks before any worker starts.

A single controller that holds the whole rollout batch can balance the ranks' shares without
any collective. Groups of samples that share a uid (the n responses of one GRPO prompt) stay
on one rank, so group-level statistics need no communication.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

from .partition import get_seqlen_balanced_partitions
from .workload import calculate_workload

__all__ = ["get_group_balanced_partitions"]


def get_group_balanced_partitions(
    seqlen_list: Sequence[int], uid_list: Sequence[Hashable], k_partitions: int
) -> list[list[int]]:
    """Split samples over ``k_partitions`` ranks, samples with the same uid kept together.

    Groups are formed by uid value (in order of first appearance; they need not be contiguous)
    and balanced on workload with equal group counts per partition (KK), as verl does for
    ``rollout.n`` responses per prompt.

    Complexity: O(n + g k log k) for g groups.

    Raises:
        ValueError: lengths and uids of different sizes, or fewer groups than partitions, or a
            group count not divisible by ``k_partitions``.

    Examples:
        >>> get_group_balanced_partitions([5, 5, 1, 1], ["a", "a", "b", "b"], 2)
        [[0, 1], [2, 3]]
    """
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"seqlen_list has {len(seqlen_list)} entries but uid_list has {len(uid_list)}")
    members: dict[Hashable, list[int]] = {}
    for index, uid in enumerate(uid_list):
        members.setdefault(uid, []).append(index)
    groups = list(members.values())
    if len(groups) < k_partitions or len(groups) % k_partitions:
        raise ValueError(
            f"{len(groups)} uid groups cannot be split evenly into k_partitions={k_partitions}: "
            f"the number of groups must be a positive multiple of it"
        )
    sample_workloads = calculate_workload(np.asarray(seqlen_list, dtype=np.int64))
    group_workloads = [int(sample_workloads[g].sum()) for g in groups]
    group_parts = get_seqlen_balanced_partitions(group_workloads, k_partitions, equal_size=True)
    return [sorted(i for g in part for i in groups[g]) for part in group_parts]
