"""The padded schedule: the route of :func:`~seqbal.schedule.build.build_dp_schedule` under a padded
cost model, where a micro-batch costs its sample count times its longest sample.

Padded bins do not add up their samples' workloads, so the count and the partition come from
the padded partitioner (``seqbal.cost``) and bin workloads from the padded model
(:func:`_padded_work`). No group moves between micro-batches (a move could break the padded
cap): the slots are the sorted micro-batches cut in ``dp_size``, ranks are placed within them,
and the schedule is assembled like the others.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..cost import padded_min_count, padded_partitions
from ..partition import roundup_divisible, split_bins_to_count
from ..partition.sample_cap import padded_runs, split_to_sample_cap
from ..workload import balance_workloads
from .divisor import _too_few_groups
from .dp_schedule import DPSchedule, SlotOrder, _schedule_of
from .inputs import WorkloadFn, _workloads
from .slots import _ranks_within_slots, _slots_from_bins


def _padded_schedule(
    array: np.ndarray,
    work: np.ndarray,
    groups: list[list[int]],
    group_sizes: np.ndarray,
    group_longest: np.ndarray,
    capacity: int,
    dp_size: int,
    step: int,
    floor: int,
    max_token_len: int,
    num_batches_divided_by: Optional[int],
    min_num_micro_batch: Optional[int],
    workload_fn: Optional[WorkloadFn],
    order: SlotOrder,
    max_samples: Optional[int] = None,
) -> DPSchedule:
    """build_dp_schedule under the padded cost: runs of the length-sorted groups, then slots.

    No group moves between micro-batches here (a move could break the padded cap), so slots
    are the sorted micro-batches cut in ``dp_size`` and the ranks are placed within them.
    With ``max_samples`` (the sample cap; ``floor`` already counts its bound) runs over it are
    split into pieces within it, or, where they need fewer, the runs under both caps are taken
    (:func:`seqbal.partition.sample_cap.padded_runs`), and the count raised to the next multiple
    of ``step`` by splitting further: a piece's padded cost is at most its run's."""
    fewest = padded_min_count(group_longest, group_sizes, capacity)
    count = roundup_divisible(max(fewest, floor), step)
    if count > len(groups):
        raise _too_few_groups(count, fewest, len(groups), dp_size, max_token_len, num_batches_divided_by, min_num_micro_batch)
    model = _padded_model(workload_fn)
    parts = padded_partitions(group_longest, group_sizes, capacity, count, workload_fn=model)
    if max_samples is not None and parts is not None:
        parts = split_to_sample_cap(parts, group_sizes, max_samples)
        if len(parts) > count:  # the runs under both caps may need fewer (the fewest for equal groups)
            runs = padded_runs(group_longest, group_sizes, capacity, max_samples)
            parts = runs if len(runs) < len(parts) else parts
            count = roundup_divisible(max(len(parts), floor), step)
            if count > len(groups):
                raise _too_few_groups(
                    count, len(parts), len(groups), dp_size, max_token_len, num_batches_divided_by, min_num_micro_batch
                )
            parts = split_bins_to_count(parts, group_sizes * group_longest, count)
    if parts is None or len(parts) != count:  # padded_partitions succeeds from the greedy count up
        raise RuntimeError(f"internal error: no padded partition into {count} parts; please report")
    parts = sorted(parts)
    bin_work = _padded_work(parts, group_sizes, group_longest, model)
    grid = _ranks_within_slots(_slots_from_bins(parts, bin_work, dp_size), bin_work, dp_size)
    return _schedule_of(array, work, groups, parts, grid, bin_work, dp_size, max_token_len, order)


def _padded_model(workload_fn: Optional[WorkloadFn]) -> Callable[[np.ndarray], np.ndarray]:
    return (lambda lengths: _workloads(lengths, workload_fn)) if workload_fn is not None else balance_workloads


def _padded_work(
    parts: list[list[int]], group_sizes: np.ndarray, group_longest: np.ndarray, model: Callable[[np.ndarray], np.ndarray]
) -> list[int]:
    """Padded workload of every part: its samples x the workload of its longest sample."""
    longest = np.array([int(group_longest[part].max()) for part in parts], dtype=np.int64)
    return [int(group_sizes[part].sum()) * int(w) for part, w in zip(parts, model(longest))]
