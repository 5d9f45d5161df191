"""Driver-side planning: a global data-parallel schedule, and balanced splits over DP ranks.

A single controller that holds the whole rollout batch can decide, before any worker starts,
which samples each data-parallel (DP) rank gets and how they form micro-batches, with no
collective at all. Two entry points:

* :func:`build_dp_schedule` decides everything: ranks *and* micro-batches.
* :func:`balance_batch` only splits the batch over ranks (balanced workload, uid groups kept
  together); each worker then micro-batches its share itself with ``rearrange_micro_batches``.

The package is split by concern, each module with one job and its own reasoning:

* :mod:`.build`: the entry point :func:`build_dp_schedule` (pack first, distribute second).
* :mod:`.dp_schedule`: :class:`DPSchedule` and its assembly from a partition and a slot grid.
* :mod:`.slots`: the aligned slots: slot evening and rank polish.
* :mod:`.equal_samples`: the ``equal_samples=True`` route.
* :mod:`.padded`: the schedule under a padded cost model.
* :mod:`.divisor`: the bin count's rounding up, and the advice when the groups are too few.
* :mod:`.balance`: :func:`balance_batch` and :func:`get_group_balanced_partitions`.
* :mod:`.inputs`: reading and checking the lengths, workloads, groups and counts.

Everything here is pure Python/NumPy on plain lengths and deterministic.
"""

from __future__ import annotations

from .balance import balance_batch, get_group_balanced_partitions
from .build import build_dp_schedule
from .divisor import _largest_fitting_divisor, _too_few_groups
from .dp_schedule import DPSchedule

__all__ = ["DPSchedule", "build_dp_schedule", "balance_batch", "get_group_balanced_partitions"]
