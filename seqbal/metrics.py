"""Numbers that describe a partition: imbalance before and after, fill, workload spread.

Kept apart from the algorithms so that trainers can log them without importing anything that
decides; every function here is read-only and O(n).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .workload import calculate_workload

__all__ = ["log_seqlen_unbalance", "micro_batch_summary"]


def log_seqlen_unbalance(seqlen_list: Sequence[int], partitions: Sequence[Sequence[int]], prefix: str) -> dict[str, Any]:
    """verl-compatible imbalance metrics of ``partitions`` versus contiguous equal slices.

    "Before" is the batch cut into ``len(partitions)`` contiguous slices of equal sample count
    (what a trainer gets without balancing); "balanced" is the given partitions.

    Returns:
        ``{prefix}/min``, ``/max``, ``/minmax_diff`` (before), ``/balanced_min``,
        ``/balanced_max`` (after) and ``/mean`` (total over the number of partitions).

    Raises:
        ValueError: no partitions, or fewer samples than partitions.

    Examples:
        >>> log_seqlen_unbalance([1, 2, 3, 4], [[0, 3], [1, 2]], "seqlen")["seqlen/balanced_max"]
        5
    """
    k = len(partitions)
    lengths = np.asarray(seqlen_list, dtype=np.int64)
    if k == 0 or len(lengths) < k:
        raise ValueError(f"need at least one partition and as many samples as partitions, got {len(lengths)} and {k}")
    slice_size = len(lengths) // k
    before = [int(lengths[i:i + slice_size].sum()) for i in range(0, slice_size * k, slice_size)]
    after = [int(lengths[list(p)].sum()) for p in partitions]
    return {
        f"{prefix}/min": min(before),
        f"{prefix}/max": max(before),
        f"{prefix}/minmax_diff": max(before) - min(before),
        f"{prefix}/balanced_min": min(after),
        f"{prefix}/balanced_max": max(after),
        f"{prefix}/mean": int(lengths.sum()) / k,
    }


def micro_batch_summary(
    lengths: Sequence[int],
    micro_batches: Sequence[Sequence[int]],
    max_token_len: int,
    workload_fn: Optional[Callable[[Any], Any]] = None,
) -> dict[str, Any]:
    """Per-micro-batch tokens and workload, fill of the cap, and workload imbalance.

    Returns a dict with ``count``, ``tokens`` (list), ``workloads`` (list), ``max_tokens``,
    ``fill`` (total tokens / (count * cap)), ``workload_imbalance`` (max / mean workload, 1.0 is
    perfect) and ``lower_bound`` (``ceildiv(total, cap)``).

    Raises:
        ValueError: ``max_token_len`` is not a positive int.

    Examples:
        >>> micro_batch_summary([4, 4, 8], [[0, 1], [2]], 8)["fill"]
        1.0
    """
    if isinstance(max_token_len, bool) or not isinstance(max_token_len, numbers.Integral) or max_token_len < 1:
        raise ValueError(f"max_token_len must be a positive int, got {max_token_len!r}")
    max_token_len = int(max_token_len)
    lengths_array = np.asarray(lengths, dtype=np.int64)
    workloads = np.asarray((workload_fn or calculate_workload)(lengths_array), dtype=np.float64)
    tokens = [int(lengths_array[list(p)].sum()) for p in micro_batches]
    work = [float(workloads[list(p)].sum()) for p in micro_batches]
    total = int(lengths_array.sum())
    count = len(micro_batches)
    mean_work = sum(work) / count if count else 0.0
    return {
        "count": count,
        "tokens": tokens,
        "workloads": work,
        "max_tokens": max(tokens) if tokens else 0,
        "fill": total / (count * max_token_len) if count else 0.0,
        "workload_imbalance": (max(work) / mean_work) if mean_work > 0 else 1.0,
        "lower_bound": -(-total // max_token_len),
    }
