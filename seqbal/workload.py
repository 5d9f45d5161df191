"""Compute-cost model of a sequence, used to balance micro-batches.

A dense transformer block spends about ``12 h^2 s`` FLOPs in its linear layers and ``2 h s^2``
in attention for a sequence of ``s`` tokens at hidden size ``h``. Dividing by ``2 h`` gives a
workload proportional to FLOPs, ``6 h s + s^2``: linear in tokens for short sequences,
quadratic once ``s`` is comparable to ``6 h``. Balancing this (not tokens) is what evens out the
time of micro-batches that mix short and long sequences. The default constant is verl's, for
``h = 4096`` (7B-class models); :func:`make_workload_fn` builds the model for another size.

Workloads are exact integers (int64), so partitions are the same on every machine.

:func:`balance_workloads` (the default workloads of tokens, made safe to balance on beyond
int64) lives here with the model it computes. The import runs one way: this module uses
:mod:`seqbal.validation`'s checks, and validation, which needs only the default model's
constant (``seqbal/_default_workload.py``), never imports this module back.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from ._default_workload import DEFAULT_HIDDEN_SIZE, DEFAULT_LINEAR_COEFFICIENT
from .validation import INT64_MAX, INT64_SAFE_TOTAL, _default_workload_total, int_argument, int_array

if TYPE_CHECKING:
    import torch


#: Lengths: a torch tensor, a NumPy array or a sequence of ints (torch is never imported here).
Lengths = Union["torch.Tensor", np.ndarray, Sequence[int]]

#: A workload model: an int64 array of lengths -> one non-negative workload per length
#: (integers, or floats rounded once to the nearest integer).
WorkloadFn = Callable[[Any], Any]

#: The lengths every rank's ``workload_fn`` is evaluated on to prove the ranks balance on the same
#: model (:func:`workload_digest`): short to long, the linear and the quadratic regime alike.
WORKLOAD_PROBE = np.array([0, 1, 2, 3, 5, 8, 13, 64, 100, 257, 1000, 1024, 4096, 8191, 32768, 131072], dtype=np.int64)


def calculate_workload(seqlens: Lengths) -> Union["torch.Tensor", np.ndarray]:
    """Relative compute of each sequence: ``24576 * s + s**2`` (dense FLOPs at hidden 4096).

    Args:
        seqlens: sequence lengths, as a tensor (kept a tensor, upcast to int64 so the square
            cannot overflow int32), a NumPy array or a sequence of ints (both give an int64
            NumPy array).

    Returns:
        The workloads, same shape as the input. O(n).

    Examples:
        >>> calculate_workload([1, 1000]).tolist()
        [24577, 25576000]
    """
    return make_workload_fn(DEFAULT_HIDDEN_SIZE)(seqlens)


def make_workload_fn(hidden_size: int) -> Callable[[Lengths], Union["torch.Tensor", np.ndarray]]:
    """Workload model ``6 * hidden_size * s + s**2`` for another model width.

    Raises:
        ValueError: ``hidden_size`` not a positive int (bools rejected; NumPy integers taken as
            their values); the returned model raises one for a length beyond int64 or whose
            workload is (about 3e9 tokens at hidden size 4096).

    Examples:
        >>> make_workload_fn(1024)([10]).tolist()
        [61540]
    """
    hidden_size = int_argument("hidden_size", hidden_size)
    linear = 6 * hidden_size

    def workload(seqlens: Lengths) -> Union["torch.Tensor", np.ndarray]:
        if type(seqlens).__module__.startswith("torch") and hasattr(seqlens, "long"):  # a tensor stays one
            if str(seqlens.dtype) == "torch.uint64" or seqlens.is_floating_point() or seqlens.is_complex() or (
                    str(seqlens.dtype) == "torch.bool"):  # too large (not wrapped), or not integers
                int_array(seqlens.reshape(-1), "seqlens", negative=False, sums=False)
            s = seqlens.long()
            if s.numel() and int(s.min()) < 0:
                raise ValueError(f"seqlens must be non-negative, got {int(s.min())}")
            _check_range(int(s.abs().max()) if s.numel() else 0, linear)
            return linear * s + s * s
        array = np.asarray(seqlens)
        s = int_array(array.reshape(-1), "seqlens", negative=False, sums=False).reshape(array.shape)
        _check_range(int(np.abs(s).max()) if s.size else 0, linear)
        return linear * s + s * s

    return workload


def _check_range(longest: int, linear: int) -> None:
    """ValueError unless the model of a length of ``longest`` tokens fits in int64 (it is exact)."""
    if linear * longest + longest * longest > INT64_MAX:
        raise ValueError(
            f"a length of {longest} tokens has the workload {linear} * s + s**2 = {linear * longest + longest * longest}, "
            f"beyond int64 (at most 2**63 - 1): workloads are exact int64"
        )


def balance_workloads(tokens: np.ndarray) -> np.ndarray:
    """The default workloads of int64 ``tokens``, as int64 values safe to balance on.

    Exact (:func:`seqbal.calculate_workload`) wherever their total fits
    :data:`INT64_SAFE_TOTAL`, which is every input a plan was ever made on; beyond it, the
    model computed in float64 and divided by the smallest power of two that brings the total
    under that bound, then floored. A balance needs only the workloads' ratios, so this keeps
    every input whose *tokens* fit (``plan_micro_batches([10**9], 2 * 10**9)``) plannable,
    where an exact int64 model would have to refuse it; the cap is still checked exactly, on
    the integer tokens. O(n).

    >>> balance_workloads(np.array([1, 1000])).tolist()
    [24577, 25576000]
    >>> balance_workloads(np.array([10**9, 10**9])).tolist()  # 2.0e18 exact: above the bound
    [125003072000000000, 125003072000000000]
    """
    total = _default_workload_total(tokens)
    if total <= INT64_SAFE_TOTAL:
        return calculate_workload(tokens)
    shift = (total // INT64_SAFE_TOTAL).bit_length() + 1  # one more halving covers float rounding
    s = tokens.astype(np.float64)
    return np.floor((DEFAULT_LINEAR_COEFFICIENT * s + s * s) / 2.0**shift).astype(np.int64)


def checked_workloads(lengths: np.ndarray, workload_fn: Optional[WorkloadFn]) -> np.ndarray:
    """``workload_fn(lengths)`` as checked int64 workloads, one per length (None: the default
    model, :func:`calculate_workload`). The one check of a caller's workload model, shared by
    every planner that takes ``workload_fn``. O(n) plus the model.

    Float results are rounded once to the nearest integer (integer workloads keep the
    partitioners exact and deterministic).

    Raises:
        ValueError: a result of another shape, a non-finite or negative workload, or one (or
            their total) beyond int64 sums (more than ``INT64_MAX // 11``), naming the sample and
            its length.

    Examples:
        >>> checked_workloads(np.array([2, 3]), lambda s: s * 1.5).tolist()
        [3, 4]
    """
    values = np.asarray((workload_fn or calculate_workload)(lengths))
    if values.shape != lengths.shape:
        raise ValueError(f"workload_fn returned shape {values.shape} for lengths of shape {lengths.shape}")
    if not np.issubdtype(values.dtype, np.integer):
        values = np.rint(values.astype(np.float64))
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(
                f"workload_fn returned {values[bad[0]]} for sample {int(bad[0])} (length {int(lengths[bad[0]])}); "
                f"workloads must be finite"
            )
        if values.size and np.abs(values).max() > INT64_SAFE_TOTAL:
            index = int(np.argmax(np.abs(values)))
            raise ValueError(
                f"workload_fn returned {values[index]:.4g} for sample {index} (length "
                f"{int(lengths.reshape(-1)[index])}), beyond int64 sums"
            )
    elif values.dtype.kind == "u" and values.size and int(values.max()) > INT64_SAFE_TOTAL:
        index = int(np.argmax(values))
        raise ValueError(
            f"workload_fn returned {int(values[index])} for sample {index} (length {int(lengths.reshape(-1)[index])}), "
            f"beyond int64 sums"
        )
    values = values.astype(np.int64)
    if (values < 0).any():
        index = int(np.argmax(values < 0))
        raise ValueError(
            f"workload_fn returned a negative workload ({int(values[index])}) for sample {index} (length "
            f"{int(lengths.reshape(-1)[index])}); workloads must be non-negative (an int64 model wraps around "
            f"past 2**63 - 1: compute in float64 or keep the powers low)"
        )
    total = float(values.sum(dtype=np.float64)) if values.size else 0.0
    if total > INT64_SAFE_TOTAL:  # the partitioners sum workloads in int64: they must not wrap around
        raise ValueError(
            f"workload_fn's workloads of these {values.size} lengths total {total:.4g}, beyond int64 sums "
            f"(at most {INT64_SAFE_TOTAL}): scale the model down (only the workloads' ratios are balanced)"
        )
    return values


def plan_workloads(lengths: np.ndarray, workload_fn: Optional[WorkloadFn]) -> np.ndarray:
    """The workloads a planner balances: :func:`balance_workloads` for the default model (exact,
    kept safe beyond int64), else :func:`checked_workloads` of the caller's model. O(n)."""
    return balance_workloads(lengths) if workload_fn is None else checked_workloads(lengths, workload_fn)


_DEFAULT_DIGEST: list[int] = []


def workload_digest(workload_fn: Optional[WorkloadFn]) -> int:
    """A 63-bit digest (a non-negative int) of a workload model: BLAKE2b of its checked workloads
    on :data:`WORKLOAD_PROBE`. Ranks compare it (in the agreement they already run) to prove
    they balance on the same model; ``None`` and :func:`calculate_workload` give the same
    digest, as they plan alike. O(len(WORKLOAD_PROBE)) plus the model (cached for ``None``).

    Raises:
        ValueError: the model fails :func:`checked_workloads` on the probe.

    Examples:
        >>> workload_digest(None) == workload_digest(calculate_workload)
        True
        >>> workload_digest(None) == workload_digest(make_workload_fn(1024))
        False
    """
    if workload_fn is None and _DEFAULT_DIGEST:
        return _DEFAULT_DIGEST[0]
    values = checked_workloads(WORKLOAD_PROBE.copy(), workload_fn)
    data = np.ascontiguousarray(values, dtype="<i8").tobytes()
    value = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & INT64_MAX
    if workload_fn is None:
        _DEFAULT_DIGEST.append(value)
    return value
