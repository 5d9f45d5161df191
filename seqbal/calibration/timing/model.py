"""Seconds of a micro-batch as a function of its lengths: the fitted time model (pure NumPy).

A training micro-batch's time is a launch and bookkeeping cost paid once (``fixed``), a cost
per sequence (varlen kernels launched or tiled per sequence, per-sequence loss terms), the
linear layers' cost per token, and attention's cost per pair of tokens of one sequence
(``sum(s**2)``)::

    seconds = fixed + per_sequence * n + per_token * sum(s) + per_token_squared * sum(s**2)

Each coefficient is a time and cannot be negative (a negative one would predict that a larger
micro-batch runs faster, which is what breaks a balance). The fit is non-negative least squares
(:func:`seqbal.calibration.nnls.weighted_nnls`) on relative residuals (each divided by the
measured time): balance is a matter of ratios, and the held-out accuracy that matters is
relative, for the small micro-batches of a plan as for the large ones.

The balance needs a workload per *sequence*, summed over a micro-batch: ``per_sequence +
per_token * s + per_token_squared * s**2``. The ``fixed`` term is paid once per micro-batch,
whatever is in it; ranks that run the same number of micro-batches pay it alike, so it does not
move a balance and is left out of :meth:`TimeModel.workload_fn` (it is in :meth:`predict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...quadratic_workload import QuadraticWorkload
from ..nnls import weighted_nnls

__all__ = ["FEATURES", "TimeModel", "features", "fit", "REFERENCE_LENGTH"]

#: Feature names, in the order of :func:`features`' columns and the model's coefficients.
FEATURES = ("fixed", "per_sequence", "per_token", "per_token_squared")
#: :meth:`TimeModel.workload_fn` scales seconds so that one sequence of this many tokens weighs
#: about 2**50: sums of thousands of such sequences stay exact in int64, and the squared term's
#: coefficient keeps about five significant digits even where it dominates (2**50 / 2**34).
REFERENCE_LENGTH = 2**17
_REFERENCE_WEIGHT = 2.0**50


def features(lengths: Sequence[int]) -> np.ndarray:
    """``[1, n, sum(s), sum(s**2)]`` of one micro-batch (float64). O(n).

    >>> features([3, 1]).tolist()
    [1.0, 2.0, 4.0, 10.0]
    """
    s = np.asarray(lengths, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or (s < 1).any():
        raise ValueError(f"a micro-batch needs one or more lengths >= 1, got {list(lengths)[:8]!r}")
    return np.array([1.0, float(s.size), float(s.sum()), float((s * s).sum())])


def fit(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the squared relative error of ``rows @ c`` against
    ``seconds``. Portable: the same rows give the same bits on every IEEE-754 machine. O(16 * P * 4).

    Raises:
        ValueError: no row, or a time that is not positive.

    >>> rows = np.array([features(b) for b in ([8], [4, 4], [2] * 4, [8, 2], [1] * 8)])
    >>> seconds = 1e-3 + 1e-5 * rows[:, 2] + 1e-7 * rows[:, 3]
    >>> bool(np.allclose(rows @ fit(rows, seconds), seconds))
    True
    """
    rows = np.asarray(rows, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[0] != seconds.shape[0]:
        raise ValueError(f"fit needs one feature row per timed micro-batch, got {rows.shape} rows for {seconds.shape} times")
    if not (np.isfinite(seconds).all() and (seconds > 0).all()):
        raise ValueError(f"times must be positive and finite, got {seconds.min()} s at least")
    return weighted_nnls(rows, seconds, 1.0 / seconds, portable=True)


@dataclass(frozen=True)
class TimeModel:
    """Fitted seconds of a micro-batch (the four coefficients of :data:`FEATURES`, >= 0).

    Examples:
        >>> m = TimeModel(fixed=1e-3, per_token=1e-5, per_token_squared=1e-8)
        >>> round(m.predict([100, 200]), 6)  # 1 ms + 3 ms + 0.5 ms
        0.0045
        >>> w = m.workload_fn  # proportional to each sequence's seconds: 2.4 ms / 1.1 ms
        >>> a, b = w([100, 200]).tolist(); round(b / a, 4), round(0.0024 / 0.0011, 4)
        (2.1818, 2.1818)
    """

    fixed: float = 0.0
    per_sequence: float = 0.0
    per_token: float = 0.0
    per_token_squared: float = 0.0

    def __post_init__(self) -> None:
        for name in FEATURES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"TimeModel.{name} must be a finite number of seconds >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))

    @classmethod
    def from_coefficients(cls, values: Sequence[float]) -> "TimeModel":
        return cls(**{name: max(float(v), 0.0) for name, v in zip(FEATURES, values)})

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in FEATURES])

    def predict(self, lengths: Sequence[int]) -> float:
        """Predicted seconds of one micro-batch of these lengths. O(n)."""
        return float(features(lengths) @ self.coefficients)

    def sequence_seconds(self, length: int) -> float:
        """Predicted seconds one sequence of ``length`` tokens adds to a micro-batch (no ``fixed``)."""
        return self.per_sequence + self.per_token * length + self.per_token_squared * float(length) ** 2

    @property
    def workload_fn(self) -> QuadraticWorkload:
        """Integer workloads proportional to :meth:`sequence_seconds` (module docstring): the
        seconds times ``2**k``, with ``k`` chosen so that a sequence of
        :data:`REFERENCE_LENGTH` tokens weighs about ``2**50``, coefficients rounded to ints.

        Raises:
            ValueError: every per-sequence coefficient is 0 (only ``fixed`` was fitted: the
                time does not depend on the lengths, and no balance can be drawn from it).
        """
        reference = self.sequence_seconds(REFERENCE_LENGTH)
        if reference <= 0:
            raise ValueError(f"the time model has no per-sequence cost ({self}): its time does not grow with the "
                             f"lengths, so it cannot weigh sequences; time larger micro-batches")
        k = math.floor(math.log2(_REFERENCE_WEIGHT / reference))
        scale = math.ldexp(1.0, k)
        values = [int(round(v * scale)) for v in (self.per_sequence, self.per_token, self.per_token_squared)]
        if not any(values):  # pragma: no cover - the reference weight keeps the largest term large
            values[2 if self.per_token_squared else 1] = 1
        return QuadraticWorkload(*values, what=f"x 2^-{k} s" if k >= 0 else f"x 2^{-k} s")
