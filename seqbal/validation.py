"""The one place that checks what seqbal's entry points are given: integers, lengths, int64 sums.

Every planning entry point (the partitioner, :func:`seqbal.plan_micro_batches`,
:func:`seqbal.build_dp_schedule`, :class:`seqbal.CostModel`, ``seqbal plan``) validates its
inputs here, so one fix reaches all of them; a private copy per module is how a NumPy-scalar
fix once reached one entry point and missed the next. The checks are exact: integers are
compared as Python ints (never through a NumPy scalar that could wrap or mix signs), and sums
that NumPy forms later are bounded first with an exact total, because an int64 sum that wraps
around is a silently wrong plan, not an error. Errors are ``ValueError`` with the numbers; a
caller that needs its own error class (``MicroBatchPlanError``) wraps them.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence, Union

import numpy as np

IntSequence = Union[Sequence[int], np.ndarray]

def as_int_array(values: IntSequence, name: str = "lengths") -> np.ndarray:
    """Return ``values`` as a 1-D int64 array, raising ``ValueError`` on anything else, including
    values whose sums could overflow int64 (see :func:`check_int64_sums`)."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(array.shape)}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if array.dtype == object:  # Python ints beyond int64, or objects that are not ints
            if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in array.tolist()):
                check_total(sum(max(int(v), 0) for v in array.tolist()), name)
        if np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array)) and np.all(np.mod(array, 1) == 0):
            check_total(float(np.abs(array).max()) * len(array), name)
            array = array.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.size and array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        raise ValueError(f"{name} holds {int(array.max())}, beyond int64")
    array = array.astype(np.int64, copy=False)
    check_int64_sums(array, name=name)
    return array


_INT64_MAX = 2**63 - 1
#: Every sum the partitioner forms (part sums, the bound's scaled sums) stays below
#: ``(_DUAL_FEASIBLE_ORDERS + 1) * total``; a total above this could wrap around in int64.
INT64_SAFE_TOTAL = _INT64_MAX // 11


def exact_total(values: np.ndarray) -> int:
    """Exact sum of the positive entries of an int64 array, as a Python int. O(n)."""
    positive = values[values > 0]
    if positive.size == 0:
        return 0
    if int(positive.max()) <= _INT64_MAX // len(positive):
        return int(positive.sum())  # cannot wrap
    return sum(positive.tolist())


def check_total(total: float, name: str) -> None:
    if total > INT64_SAFE_TOTAL:
        raise ValueError(
            f"the {name} sum to {int(total)}, above {INT64_SAFE_TOTAL} (int64 max / 11): sums of "
            f"micro-batches and of the packing bound could overflow int64; use smaller units"
        )


def check_int64_sums(
    tokens: IntSequence, workloads: Union[IntSequence, str, None] = None, *, name: str = "lengths"
) -> None:
    """Raise ``ValueError`` when a sum the partitioner or the planner forms could overflow int64.

    The one guard used by every partitioner entry point (through its input conversion),
    :func:`seqbal.plan_micro_batches` / :func:`seqbal.plan_data_parallel` and
    :func:`seqbal.build_dp_schedule`. It checks the exact (Python int) total of ``tokens``
    against :data:`INT64_SAFE_TOTAL`; with ``workloads`` also their total, where
    ``workloads="default"`` means the default model ``24576 s + s**2`` computed exactly from
    ``tokens`` (so the check runs before the model itself could wrap around).

    Complexity: O(n).

    >>> check_int64_sums([2**61] * 4)
    Traceback (most recent call last):
    ...
    ValueError: the lengths sum to 9223372036854775808, above 838488366986797800 (int64 max / 11): sums of micro-batches and of the packing bound could overflow int64; use smaller units
    """
    array = np.asarray(tokens)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        array = as_int_array(array, name)  # converts, checks the total, or raises
    elif array.size and array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        raise ValueError(f"{name} holds {int(array.max())}, beyond int64")
    array = array.astype(np.int64, copy=False)
    check_total(exact_total(array), name)
    if isinstance(workloads, str):
        if workloads != "default":
            raise ValueError(f"workloads must be values or 'default', got {workloads!r}")
        from .workload import DEFAULT_LINEAR_COEFFICIENT

        positive = array[array > 0]
        if positive.size and int(positive.max()) <= 2**31:  # each workload fits in int64
            total = exact_total(DEFAULT_LINEAR_COEFFICIENT * positive + positive * positive)
        else:  # Python ints: the squares cannot wrap
            total = sum(DEFAULT_LINEAR_COEFFICIENT * v + v * v for v in positive.tolist())
        check_total(total, "workloads")
    elif workloads is not None:
        check_total(exact_total(as_int_array(workloads, "workloads")), "workloads")


def check_items_fit(sizes: np.ndarray, capacity: int) -> None:
    check_capacity(capacity)
    if sizes.size and (sizes < 0).any():
        index = int(np.argmax(sizes < 0))
        raise ValueError(f"length of item {index} is negative ({int(sizes[index])})")
    if sizes.size and sizes.max() > capacity:
        index = int(np.argmax(sizes > capacity))
        raise ValueError(f"item {index} has {int(sizes[index])} tokens and exceeds capacity {capacity}")


def check_capacity(capacity: Any) -> None:
    if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool):
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")


def check_count(value: Any, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")


def check_is_partition(bins: Sequence[Sequence[Any]], n: int) -> None:
    """ValueError unless ``bins`` hold every index ``0..n-1`` exactly once. O(n)."""
    seen = np.zeros(n, dtype=bool)
    for position, items in enumerate(bins):
        for item in items:
            if not isinstance(item, (int, np.integer)) or isinstance(item, bool) or not 0 <= item < n:
                raise ValueError(f"bin {position} holds {item!r}, not an index into {n} items")
            if seen[item]:
                raise ValueError(f"item {item} appears twice in bins (again in bin {position})")
            seen[item] = True
    if not seen.all():
        raise ValueError(f"bins hold {int(seen.sum())} of the {n} items; item {int(np.argmin(seen))} is missing")
