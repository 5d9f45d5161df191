"""seqbal: strict-cap, balanced micro-batching of variable-length sequences.

Change ``from verl.utils.seqlen_balancing import rearrange_micro_batches`` into
``from seqbal import rearrange_micro_batches``: same signature, but ``max_token_len`` is a hard
cap, the count is close to the packing optimum, and data-parallel ranks agree in two
all-reduces without ever leaving a rank hanging on an error.
"""

from .metrics import log_seqlen_unbalance, micro_batch_summary
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
from .rearrange import (
    MicroBatchPlanError,
    effective_lengths,
    get_reverse_idx,
    plan_data_parallel,
    plan_micro_batches,
    rearrange_micro_batches,
    restore_dynamic_batch,
)
from .schedule import DPSchedule, balance_batch, build_dp_schedule, get_group_balanced_partitions
from .workload import calculate_workload, make_workload_fn

__version__ = "0.1.0"

__all__ = [
    "rearrange_micro_batches",
    "plan_micro_batches",
    "plan_data_parallel",
    "MicroBatchPlanError",
    "effective_lengths",
    "get_reverse_idx",
    "restore_dynamic_batch",
    "get_seqlen_balanced_partitions",
    "karmarkar_karp",
    "calculate_workload",
    "make_workload_fn",
    "ceildiv",
    "roundup_divisible",
    "log_seqlen_unbalance",
    "micro_batch_summary",
    "get_group_balanced_partitions",
    "build_dp_schedule",
    "DPSchedule",
    "balance_batch",
    "first_fit_partitions",
    "best_fit_decreasing_partitions",
    "split_bins_to_count",
    "packing_lower_bound",
    "capped_balanced_partitions",
]
