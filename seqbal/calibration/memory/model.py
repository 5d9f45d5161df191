"""Peak bytes of a micro-batch as a function of its lengths: the fitted model (pure NumPy).

A training micro-batch's peak memory is the sum of what it keeps for the backward pass and
the largest temporary alive at the worst moment. What it keeps grows with its tokens (hidden
states of every layer), with the sum of its squared lengths where attention scores are kept
(eager or math attention: one ``heads x s x s`` matrix per sequence and layer) and with its
number of sequences (per-sequence buffers). The worst temporary belongs to its longest
sequence (that sequence's scores or their gradient, alive one layer at a time). Hence six
features, with non-negative coefficients::

    peak = fixed + per_sequence * n + per_token * sum(s) + per_token_squared * sum(s**2)
                 + per_longest * max(s) + per_longest_squared * max(s)**2

Why this model: each term is a buffer class a transformer step allocates, so a coefficient is
a physical size in bytes and cannot be negative; a model with a negative coefficient would
predict that a bigger micro-batch needs less memory, which is what breaks a cap. The fit is
non-negative least squares on residuals divided by ``sqrt(peak * largest peak)``: halfway
between relative residuals (every probe counts alike, the tiny ones too, whose allocator
rounding is large for their size) and absolute ones (only the largest probes count). The
micro-batches that matter are planned near the budget (the comparison is in
docs/memory.md). With six
features NNLS is solved exactly by trying every support (64 ordinary least-squares fits, each
6 x P): the optimum of NNLS is the least-squares fit on its support, and every support whose
fit is non-negative is feasible, so the best of them is the optimum. No SciPy needed.

The model is convex in the lengths, which makes worst cases easy: over micro-batches of at
most ``T`` tokens whose lengths lie in ``[shortest, longest]``, the worst is at a vertex:
``k`` sequences of the longest length, ``m`` of the shortest and at most one other; for each
``k`` the prediction is convex in ``m``, so only the ends of its range are tried
(:meth:`MemoryModel.worst_case`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ...cost import CostModel, MemoryCost
from ..nnls import weighted_nnls

__all__ = ["FEATURES", "MemoryModel", "features", "fit"]

#: Feature names, in the order of :func:`features`' columns and the model's coefficients.
FEATURES = ("fixed", "per_sequence", "per_token", "per_token_squared", "per_longest", "per_longest_squared")


def features(lengths: Sequence[int]) -> np.ndarray:
    """The six features of one micro-batch: ``[1, n, sum(s), sum(s**2), max(s), max(s)**2]``
    (float64). O(n).

    >>> features([3, 1]).tolist()
    [1.0, 2.0, 4.0, 10.0, 3.0, 9.0]
    """
    s = np.asarray(lengths, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or (s < 1).any():
        raise ValueError(f"a micro-batch needs one or more lengths >= 1, got {list(lengths)[:8]!r}")
    longest = float(s.max())
    return np.array([1.0, float(s.size), float(s.sum()), float((s * s).sum()), longest, longest * longest])


def fit(rows: np.ndarray, peaks: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the squared error of ``rows @ c`` against ``peaks``,
    each residual divided by ``sqrt(peak * max(peaks))`` (module docstring); exact NNLS over
    every support. O(2**6 * P) for P probes.

    Raises:
        ValueError: no probe, or a peak that is not positive.

    >>> rows = np.array([features(b) for b in ([8], [4, 4], [2] * 4, [8, 2], [6, 3, 1], [1] * 8)])
    >>> peaks = 100 + 10 * rows[:, 2] + 3 * rows[:, 3]  # 100 bytes + 10 per token + 3 per squared token
    >>> c = fit(rows, peaks)
    >>> bool(np.allclose(rows @ c, peaks)), bool((c >= 0).all())
    (True, True)
    """
    rows = np.asarray(rows, dtype=np.float64)
    peaks = np.asarray(peaks, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[0] != peaks.shape[0]:
        raise ValueError(f"fit needs one feature row per measured peak, got {rows.shape} rows for {peaks.shape} peaks")
    if (peaks <= 0).any():
        raise ValueError(f"peaks must be positive, got {peaks.min()}")
    return weighted_nnls(rows, peaks, 1.0 / np.sqrt(peaks * peaks.max()))


def _run_features(high: int, longs: int, low: int, shorts: int, middle: int) -> np.ndarray:
    """:func:`features` of ``longs`` sequences of ``high``, ``shorts`` of ``low`` and one of
    ``middle`` (none when 0), in O(1)."""
    n = longs + shorts + (1 if middle else 0)
    total = longs * high + shorts * low + middle
    squares = longs * high * high + shorts * low * low + middle * middle
    longest = max(high if longs else 0, low if shorts else 0, middle)
    return np.array([1.0, n, total, squares, longest, longest * longest], dtype=np.float64)


@dataclass(frozen=True)
class MemoryModel:
    """Fitted peak bytes of a micro-batch (the six coefficients of :data:`FEATURES`, >= 0).

    Examples:
        >>> m = MemoryModel(fixed=1000.0, per_token=10.0, per_token_squared=1.0)
        >>> m.predict([10, 20])
        1800
        >>> m.worst_case(30, (1, 30))[0]  # one sequence of 30 tokens
        2200
    """

    fixed: float = 0.0
    per_sequence: float = 0.0
    per_token: float = 0.0
    per_token_squared: float = 0.0
    per_longest: float = 0.0
    per_longest_squared: float = 0.0

    def __post_init__(self) -> None:
        for name in FEATURES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"MemoryModel.{name} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))

    @classmethod
    def from_coefficients(cls, values: Sequence[float]) -> "MemoryModel":
        return cls(**{name: max(float(v), 0.0) for name, v in zip(FEATURES, values)})

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in FEATURES])

    def predict(self, lengths: Sequence[int]) -> int:
        """Predicted peak bytes of one micro-batch of these lengths (rounded up). O(n)."""
        return int(math.ceil(float(features(lengths) @ self.coefficients)))

    def cost_model(self, round_to: int = 1) -> CostModel:
        """A :class:`seqbal.CostModel` whose cost of every micro-batch is at least
        :meth:`predict`'s: the longest sequence's terms are folded into the additive ones
        (``max(s) <= sum(s)``, ``max(s)**2 <= sum(s**2)``), exact for one sequence and high by
        at most ``per_longest * (sum - max) + per_longest_squared * (sum of squares - max**2)``."""
        return CostModel(round_to=round_to, memory=MemoryCost(
            fixed=int(math.ceil(self.fixed)),
            per_sequence=self.per_sequence,
            per_token=self.per_token + self.per_longest,
            per_token_squared=self.per_token_squared + self.per_longest_squared,
        ))

    def worst_case(self, tokens: int, length_range: Optional[tuple[int, int]] = None) -> tuple[int, list[int]]:
        """The largest predicted peak of a micro-batch of at most ``tokens`` tokens whose lengths
        lie in ``length_range = (shortest, longest)`` (default ``(1, tokens)``: any lengths),
        and one such micro-batch (lengths, longest first). Exact: the model is convex in the
        lengths, so the worst is at a vertex (module docstring). O(tokens / longest).
        """
        tokens = int(tokens)
        low, high = length_range if length_range is not None else (1, tokens)
        high = min(int(high), tokens)
        low = int(low)
        if tokens < 1 or low < 1 or low > high:
            return 0, []
        best, example = -1.0, (0, 0, 0)
        c = self.coefficients
        for k in range(0, tokens // high + 1):
            rest = tokens - k * high
            many = rest // low
            # The rest is m shortest sequences and at most one other (the vertices); convex in m,
            # so only the ends of each family count: no other, or one taking all that is left.
            candidates = [(k, m, 0) for m in {0, many} if k + m]
            fewest = max(0, -(-(rest - high) // low))  # the other must not be longer than high
            for m in {fewest, many - 1}:
                middle = rest - m * low
                if 0 <= m and low <= middle <= high:
                    candidates.append((k, m, middle))
            for longs, shorts, middle in candidates:
                value = float(_run_features(high, longs, low, shorts, middle) @ c)
                if value > best:
                    best, example = value, (longs, shorts, middle)
        longs, shorts, middle = example
        return int(math.ceil(best)), sorted([high] * longs + [low] * shorts + ([middle] if middle else []), reverse=True)

    def max_token_len(self, byte_cap: int, length_range: Optional[tuple[int, int]] = None) -> int:
        """The largest ``T`` whose :meth:`worst_case` is ``<= byte_cap`` (0 when not even one
        token fits). Bisection: the worst case only grows with ``T``. O(log T * T / longest)."""
        low = 1 if length_range is None else int(length_range[0])
        if self.worst_case(low, length_range)[0] > byte_cap:
            return 0
        high = low
        while self.worst_case(high * 2, length_range)[0] <= byte_cap:
            high *= 2
            if high > 2 ** 40:
                raise ValueError(f"the fitted model predicts no growth with tokens: no finite cap under {byte_cap} bytes")
        low, high = high, high * 2  # worst(low) fits, worst(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            if self.worst_case(middle, length_range)[0] <= byte_cap:
                low = middle
            else:
                high = middle
        return low
