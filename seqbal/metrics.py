"""Numbers that describe a partition: imbalance before and after, fill, workload spread.

Kept apart from the algorithms so that trainers can log them without importing anything that
decides; every function here is read-only and O(n).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from .cost import as_cost_model
from .validation import check_is_partition, int_argument, int_array
from .workload import balance_workloads
from .workload import calculate_workload

__all__ = ["METRIC_KEYS", "log_seqlen_unbalance", "micro_batch_summary", "micro_batch_metrics"]

#: Every key :func:`micro_batch_metrics` returns (after its prefix), with what it means: the one
#: place the names live, so that every logger sees the same keys.
METRIC_KEYS = {
    "count": "micro-batches of the step on this rank, dummies included (what the step runs)",
    "lower_bound": "ceildiv(total tokens, max_token_len), each sample rounded as the cost model rounds a "
    "sequence: SPEC's count bound, which no plan goes below (not the tighter packing bound)",
    "fill": "total tokens (rounded as for lower_bound) / (count x max_token_len), dummies counted as "
    "waste; 1.0 is a full cap",
    "workload_imbalance": "max / mean workload over the real micro-batches; 1.0 is perfect",
    "max_cost": "cost of the largest micro-batch under the cost model (<= max_token_len)",
    "max_tokens": "effective tokens of the largest micro-batch",
    "dummies": "dummy micro-batches (empty index lists) added to reach the agreed count",
}


def _index_lists(value: Any, name: str) -> int:
    """How many index lists ``value`` holds; ValueError naming ``name`` if it holds none."""
    try:
        return len(value)
    except TypeError:
        raise ValueError(f"{name} must be a list of index lists, got {value!r:.60}") from None


def _check_indices(parts: Sequence[Sequence[int]], n: int, name: str) -> None:
    """ValueError naming ``name`` unless ``parts`` hold every index 0..n-1 exactly once."""
    try:
        check_is_partition(parts, n)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{name}: {error}") from None


def log_seqlen_unbalance(seqlen_list: Sequence[int], partitions: Sequence[Sequence[int]], prefix: str) -> dict[str, Any]:
    """verl-compatible imbalance metrics of ``partitions`` versus contiguous equal slices.

    "Before" is the batch cut into ``len(partitions)`` contiguous slices of equal sample count
    (what a trainer gets without balancing); "balanced" is the given partitions.

    Returns:
        ``{prefix}/min``, ``/max``, ``/minmax_diff`` (before), ``/balanced_min``,
        ``/balanced_max`` (after) and ``/mean`` (total over the number of partitions).

    Raises:
        ValueError: lengths that are not non-negative ints, no partitions, fewer samples than
            partitions, or partitions that do not hold every sample index exactly once.

    Examples:
        >>> log_seqlen_unbalance([1, 2, 3, 4], [[0, 3], [1, 2]], "seqlen")["seqlen/balanced_max"]
        5
    """
    k = _index_lists(partitions, "partitions")
    lengths = int_array(seqlen_list, "seqlen_list", negative=False)
    if k == 0 or len(lengths) < k:
        raise ValueError(f"need at least one partition and as many samples as partitions, got {len(lengths)} and {k}")
    _check_indices(partitions, len(lengths), "partitions")
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
    max_token_len = int_argument("max_token_len", max_token_len)
    lengths_array = int_array(lengths, "lengths", samples=True, integral_floats=False)
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


def micro_batch_metrics(
    lengths: Sequence[int],
    batch_idx_list: Sequence[Sequence[int]],
    max_token_len: int,
    *,
    cost_model: Any = None,
    prefix: str = "seqbal",
    workload_fn: Optional[Callable[[Any], Any]] = None,
) -> dict[str, Any]:
    """The plan of one step as a flat dict of numbers for a logger (wandb, tensorboard).

    Keys are ``f"{prefix}/{name}"`` for every name of :data:`METRIC_KEYS` (their meanings are
    there); values are ints or floats. Costs are under ``cost_model`` (the one the plan used;
    effective tokens by default); workloads use ``workload_fn`` (default
    the default model; padded micro-batches weigh ``samples x`` their
    longest's workload). Empty index lists are dummies (copies of a sample; their own cost is
    not counted). Every value is a plain Python int or float (``json.dumps`` takes the dict),
    whatever NumPy types came in. The default workloads take the planner's route
    (:func:`seqbal.workload.balance_workloads`: exact where int64 holds them, float64 beyond).
    O(n).

    Raises:
        ValueError: ``max_token_len`` not a positive int (NumPy integers are taken as their
            values), lengths that are not non-negative ints within int64, or index lists that
            do not hold every sample index exactly once (dummies aside).

    Examples:
        >>> metrics = micro_batch_metrics([4, 4, 8], [[0, 1], [2], []], 8)
        >>> metrics["seqbal/count"], metrics["seqbal/lower_bound"], metrics["seqbal/dummies"]
        (3, 2, 1)
        >>> round(metrics["seqbal/fill"], 3)
        0.667
    """
    max_token_len = int_argument("max_token_len", max_token_len)
    cost = as_cost_model(cost_model)
    array = int_array(lengths, "lengths", samples=True, integral_floats=False)
    values = array.tolist()
    _index_lists(batch_idx_list, "batch_idx_list")
    _check_indices(batch_idx_list, len(values), "batch_idx_list")
    real = [list(part) for part in batch_idx_list if len(part)]
    work_of = workload_fn or balance_workloads
    if cost.padded:  # a padded micro-batch computes on samples x its longest
        rounded = cost.rounded(array)
        padded_work = np.asarray(work_of(rounded), dtype=np.float64) if values else np.zeros(0)
        work = [len(p) * float(padded_work[p][int(np.argmax(rounded[p]))]) for p in real]
    else:
        workloads = np.asarray(work_of(array), dtype=np.float64) if values else np.zeros(0)
        work = [float(workloads[p].sum()) for p in real]
    costs = [int(c) for c in cost.part_costs(values, real)]
    # per-sequence rounding only: packing rounds a whole micro-batch, and padding adds at least 0
    sample_costs = int(cost.sample_costs(np.asarray(values, dtype=np.int64)).sum()) if values else 0
    count = len(batch_idx_list)
    mean_work = sum(work) / len(work) if work else 0.0
    names = {
        "count": count,
        "lower_bound": -(-sample_costs // max_token_len),
        "fill": sample_costs / (count * max_token_len) if count else 0.0,
        "workload_imbalance": float(max(work) / mean_work) if mean_work > 0 else 1.0,
        "max_cost": max(costs, default=0),
        "max_tokens": max((sum(values[i] for i in p) for p in real), default=0),
        "dummies": count - len(real),
    }
    assert set(names) == set(METRIC_KEYS)  # one place names the keys: keep them in step
    return {f"{prefix}/{name}": names[name] for name in METRIC_KEYS}
