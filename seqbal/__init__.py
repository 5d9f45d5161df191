"""seqbal: strict-cap, balanced micro-batching of variable-length sequences.

Change ``from verl.utils.seqlen_balancing import rearrange_micro_batches`` into
``from seqbal import rearrange_micro_batches``: same signature, but ``max_token_len`` is a hard
cap, the count is close to the packing optimum, and data-parallel ranks agree in two
all-reduces without ever leaving a rank hanging on an error.

Names are loaded lazily: planning on plain lengths (:func:`plan_micro_batches`,
:func:`plan_data_parallel`, :func:`build_dp_schedule`, the partitioner, ``seqbal plan``) needs
only NumPy, so ``import seqbal`` does not import torch or tensordict; they load the first time a
TensorDict or torch.distributed feature (:func:`rearrange_micro_batches`,
:func:`restore_dynamic_batch`, :func:`loss_weights`, a ``dp_group``) is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The one place the version is written; setup.cfg reads it (``attr: seqbal.__version__``).
__version__ = "0.2.0"

#: Public name -> the submodule that defines it.
_EXPORTS = {
    "rearrange_micro_batches": "rearrange",
    "effective_lengths": "rearrange",
    "get_reverse_idx": "rearrange",
    "restore_dynamic_batch": "rearrange",
    "padding_window": "rearrange",
    "padding_windows": "rearrange",
    "trim_to_window": "rearrange",
    "plan_micro_batches": "plan",
    "plan_data_parallel": "plan",
    "dummy_source": "plan",
    "MicroBatchPlanError": "plan",
    "CostModel": "cost",
    "MemoryCost": "cost",
    "get_seqlen_balanced_partitions": "partition",
    "karmarkar_karp": "partition",
    "ceildiv": "partition",
    "roundup_divisible": "partition",
    "first_fit_partitions": "partition",
    "best_fit_decreasing_partitions": "partition",
    "split_bins_to_count": "partition",
    "packing_lower_bound": "partition",
    "capped_balanced_partitions": "partition",
    "calculate_workload": "workload",
    "make_workload_fn": "workload",
    "workload_from_config": "workload_config",
    "log_seqlen_unbalance": "metrics",
    "micro_batch_summary": "metrics",
    "micro_batch_metrics": "metrics",
    "METRIC_KEYS": "metrics",
    "loss_weights": "loss",
    "get_group_balanced_partitions": "schedule",
    "build_dp_schedule": "schedule",
    "DPSchedule": "schedule",
    "balance_batch": "schedule",
    "StepPlanner": "stream",
    "TokenBudgetBatchSampler": "epochs",
    "pack_rows": "epochs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seqbal' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the names without the lazy look-up
    from .cost import CostModel, MemoryCost
    from .loss import loss_weights
    from .metrics import METRIC_KEYS, log_seqlen_unbalance, micro_batch_metrics, micro_batch_summary
    from .partition import (
        best_fit_decreasing_partitions,
        capped_balanced_partitions,
        ceildiv,
        first_fit_partitions,
        get_seqlen_balanced_partitions,
        karmarkar_karp,
        packing_lower_bound,
        roundup_divisible,
        split_bins_to_count,
    )
    from .plan import MicroBatchPlanError, dummy_source, plan_data_parallel, plan_micro_batches
    from .rearrange import (
        effective_lengths,
        get_reverse_idx,
        padding_window,
        padding_windows,
        rearrange_micro_batches,
        restore_dynamic_batch,
        trim_to_window,
    )
    from .schedule import DPSchedule, balance_batch, build_dp_schedule, get_group_balanced_partitions
    from .epochs import TokenBudgetBatchSampler, pack_rows
    from .stream import StepPlanner
    from .workload import calculate_workload, make_workload_fn
    from .workload_config import workload_from_config
