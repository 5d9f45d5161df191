"""The unit of a loss's mean: each sample alone, or a group of samples (a preference pair, a
GRPO group), labelled per micro-batch for :func:`seqbal.loss_weights`.

A pairwise loss (DPO, SimPO) is a function of both members of a pair at once, so a pair can
only be scored where both members sit in one micro-batch; a group mean that counts a pair's
members apart across accumulation steps weighs it wrongly (even with the wrong sign). So the
groups are read here, from the same two descriptions the planner keeps whole
(``force_group_size``: consecutive samples; or one id per sample), and a group whose members
are spread over micro-batches is an error, never a silent re-weighting. Groups are local to a
rank (ids are not compared across ranks): the planner never splits one over ranks. Pure
Python and NumPy; no torch, no collectives.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .validation import group_keys

__all__ = ["unit_labels"]


def _group_ids(force_group_size: Any, group_ids: Any, n: int) -> Optional[list[Any]]:
    """One id per sample ``0..n-1``, or None when each sample is its own unit."""
    if isinstance(force_group_size, bool) or not isinstance(force_group_size, (int, np.integer)) or force_group_size < 1:
        raise ValueError(f"force_group_size must be a positive int, got {force_group_size!r}")
    if group_ids is None:
        if force_group_size == 1:
            return None
        if n % force_group_size:
            raise ValueError(
                f"force_group_size={force_group_size} does not divide this rank's {n} samples; consecutive "
                f"samples i*g .. i*g+g-1 form a group, as in the plan"
            )
        return [index // int(force_group_size) for index in range(n)]
    if force_group_size != 1:
        raise ValueError(
            f"pass either force_group_size (got {force_group_size}) or group_ids, not both: each describes the groups"
        )
    ids = group_keys(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids holds {len(ids)} ids but this rank's micro-batches hold {n} samples; pass one per sample")
    return ids


def unit_labels(
    batch_idx_list: Sequence[Sequence[int]], n: int, force_group_size: Any = 1, group_ids: Any = None
) -> tuple[list[list[int]], int, bool]:
    """Each sample's unit, as a label ``0..units-1`` per micro-batch, in its index list's order.

    Args:
        batch_idx_list: the micro-batches' index lists (a partition of ``0..n-1``; ``[]`` for a
            dummy micro-batch).
        n: the number of samples.
        force_group_size: consecutive samples ``i*g .. i*g+g-1`` form a group (1: no groups).
        group_ids: or one hashable id per sample ``0..n-1``; samples with equal ids form a group.

    Returns:
        ``(labels, units, grouped)``: for each micro-batch the label of each of its samples,
        the number of units (groups, or ``n``), and whether groups were given. Labels are
        numbered in order of first appearance. O(n).

    Raises:
        ValueError: a bad ``force_group_size``, both descriptions given, ``group_ids`` of the
            wrong length or unhashable, or a group whose members sit in two micro-batches.

    Examples:
        >>> unit_labels([[0, 1], [2, 3]], 4, force_group_size=2)
        ([[0, 0], [1, 1]], 2, True)
        >>> unit_labels([[1], [0, 2]], 3)
        ([[1], [0, 2]], 3, False)
    """
    ids = _group_ids(force_group_size, group_ids, n)
    if ids is None:
        return [list(part) for part in batch_idx_list], n, False
    label_of: dict[Any, int] = {}
    home: dict[Any, tuple[int, int]] = {}
    labels = []
    for position, part in enumerate(batch_idx_list):
        own = []
        for index in part:
            group = ids[index]
            where = home.setdefault(group, (position, index))
            if where[0] != position:
                raise ValueError(
                    f"group {group!r} is split: sample {where[1]} is in micro-batch {where[0]} and sample {index} in "
                    f"micro-batch {position}; a group's members must share a micro-batch (plan with force_group_size, "
                    f"or keep the members of each group together)"
                )
            own.append(label_of.setdefault(group, len(label_of)))
        labels.append(own)
    return labels, len(label_of), True
