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

__all__ = ["FEATURES", "MemoryModel", "envelope", "features", "fit"]

#: Feature names, in the order of :func:`features`' columns and the model's coefficients.
FEATURES = ("fixed", "per_sequence", "per_token", "per_token_squared", "per_longest", "per_longest_squared")
#: The most tokens a cap may have: a model whose worst micro-batch of this many tokens still fits
#: its byte cap predicts (almost) no growth, and no cap is derived from it.
MAX_CAP_TOKENS = 2 ** 40
#: The most sequences the worst-case search walks through (``tokens // longest``).
MAX_WORST_CASE_SEQUENCES = 2 ** 24
#: Probes whose peak is at least this fraction of the largest are the upper range: the fit is
#: raised to lie at or above each of them (:func:`envelope`).
UPPER_RANGE = 1 / 8


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


def envelope(rows: np.ndarray, peaks: np.ndarray, coefficients: np.ndarray, upper: float = UPPER_RANGE) -> float:
    """The factor (>= 1) that raises ``coefficients`` until the fit is at or above every probe
    of the upper range (peak >= ``upper`` x the largest). O(P).

    Why: a plan packs micro-batches up to a byte cap, so the fit's errors there matter one way
    only. A least-squares fit under-predicts about half the probes it passes between; raised to
    their envelope, the fit minus any lower bound of the true peak that holds at those probes
    (a linear function of the features, non-negative at each of them) stays non-negative on
    their convex hull, where the micro-batches near the cap lie.

    >>> rows = np.array([features([s]) for s in (100, 200, 400)])
    >>> float(envelope(rows, np.array([110.0, 190.0, 400.0]), np.array([0, 0, 1.0, 0, 0, 0])))
    1.1
    """
    rows = np.asarray(rows, dtype=np.float64)
    peaks = np.asarray(peaks, dtype=np.float64)
    predicted = rows @ np.asarray(coefficients, dtype=np.float64)
    chosen = peaks >= upper * peaks.max()
    if not (predicted[chosen] > 0).all():
        return 1.0
    return max(1.0, float((peaks[chosen] / predicted[chosen]).max()))


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
        lengths, so the worst is at a vertex (module docstring). O(tokens / longest), vectorised.

        Raises:
            ValueError: more than :data:`MAX_WORST_CASE_SEQUENCES` sequences of the longest
                length fit in ``tokens`` (no cap is ever that large: :meth:`max_token_len`).
        """
        tokens = int(tokens)
        low, high = length_range if length_range is not None else (1, tokens)
        high = min(int(high), tokens)
        low = int(low)
        if tokens < 1 or low < 1 or low > high:
            return 0, []
        if tokens // high > MAX_WORST_CASE_SEQUENCES:
            raise ValueError(f"a micro-batch of {tokens} tokens holds over {MAX_WORST_CASE_SEQUENCES} sequences of "
                             f"{high} tokens: too many to search for its worst case")
        c = self.coefficients
        k = np.arange(0, tokens // high + 1, dtype=np.int64)
        rest = tokens - k * high
        many = rest // low
        fewest = np.maximum(0, -(-(rest - high) // low))  # the other must not be longer than high
        # The rest is m shortest sequences and at most one other (the vertices); convex in m, so
        # only the ends of each family count: no other, or one taking all that is left.
        families = [(np.zeros_like(k), np.zeros_like(k)), (many, np.zeros_like(k)),
                    (fewest, rest - fewest * low), (many - 1, rest - (many - 1) * low)]
        best, example = -1.0, (0, 0, 0)
        for shorts, middle in families:
            valid = (shorts >= 0) & (k + shorts + (middle > 0) > 0)
            valid &= (middle == 0) | ((middle >= low) & (middle <= high))
            if not valid.any():
                continue
            longs, shorts, middle = k[valid], shorts[valid], middle[valid]
            n = longs + shorts + (middle > 0)
            total = longs * high + shorts * low + middle
            squares = longs * float(high * high) + shorts * float(low * low) + middle.astype(np.float64) ** 2
            longest = np.maximum(np.maximum(np.where(longs > 0, high, 0), np.where(shorts > 0, low, 0)), middle)
            longest = longest.astype(np.float64)
            values = (c[0] + c[1] * n + c[2] * total + c[3] * squares + c[4] * longest + c[5] * longest * longest)
            at = int(np.argmax(values))
            if values[at] > best:
                best, example = float(values[at]), (int(longs[at]), int(shorts[at]), int(middle[at]))
        longs, shorts, middle = example
        return int(math.ceil(best)), sorted([high] * longs + [low] * shorts + ([middle] if middle else []), reverse=True)

    def _floor(self, tokens: int, low: int, high: int) -> float:
        """A lower bound of :meth:`worst_case` in O(1): ``tokens // h`` sequences of
        ``h = min(high, tokens)`` (a micro-batch of at most ``tokens`` tokens in the range)."""
        h = min(high, tokens)
        return float(_run_features(h, tokens // h, low, 0, 0) @ self.coefficients)

    def max_token_len(self, byte_cap: int, length_range: Optional[tuple[int, int]] = None) -> int:
        """The largest ``T`` whose :meth:`worst_case` is ``<= byte_cap`` (0 when not even one
        sequence of the shortest length fits). Bisection: the worst case only grows with
        ``T``; an O(1) lower bound finds its upper end. O(log T * T / longest).

        Raises:
            ValueError: the model predicts (almost) no growth: a micro-batch of
                :data:`MAX_CAP_TOKENS` tokens would still fit ``byte_cap``, or the worst case
                would have to search more than :data:`MAX_WORST_CASE_SEQUENCES` sequences.
        """
        low = 1 if length_range is None else int(length_range[0])
        high = MAX_CAP_TOKENS if length_range is None else int(length_range[1])
        if self.worst_case(low, length_range)[0] > byte_cap:
            return 0
        upper = low
        while self._floor(upper, low, high) <= byte_cap:
            upper *= 2
            if upper > MAX_CAP_TOKENS:
                raise ValueError(
                    f"the fitted model predicts (almost) no growth with tokens: a micro-batch of {upper // 2} tokens "
                    f"is predicted at {self._floor(upper // 2, low, high):.0f} bytes, still within {byte_cap}: "
                    f"no finite cap ({self!r})")
        if upper // min(high, upper) > MAX_WORST_CASE_SEQUENCES:
            raise ValueError(
                f"the fitted model grows too slowly for a cap: {byte_cap} bytes admit over "
                f"{MAX_WORST_CASE_SEQUENCES} sequences of {min(high, upper)} tokens ({self!r})")
        fits, over = low, upper  # worst(fits) <= byte_cap < worst(over)
        while over - fits > 1:
            middle = (fits + over) // 2
            if self.worst_case(middle, length_range)[0] <= byte_cap:
                fits = middle
            else:
                over = middle
        return fits

    def max_tokens_by_bytes(self, byte_cap: int, length_range: Optional[tuple[int, int]] = None) -> float:
        """An upper bound of the tokens of any micro-batch whose :meth:`cost_model` cost is
        within ``byte_cap`` (lengths in ``length_range``, default any): the cap less the fixed
        bytes over the cheapest bytes per token of one sample. ``inf`` when a token costs
        nothing. O(1).

        >>> MemoryModel(fixed=100.0, per_sequence=50.0, per_token=10.0, per_token_squared=0.5).max_tokens_by_bytes(3100)
        150.0
        """
        memory = self.cost_model().memory
        low = 1 if length_range is None else int(length_range[0])
        high = None if length_range is None else int(length_range[1])
        candidates = {low} if high is None else {low, high}
        if memory.per_token_squared > 0:
            best = math.sqrt(memory.per_sequence / memory.per_token_squared)
            for s in (math.floor(best), math.ceil(best)):
                candidates.add(max(low, s) if high is None else min(max(low, s), high))
        lengths = np.array(sorted(s for s in candidates if s >= 1), dtype=np.int64)
        per_token = float((memory.sample_bytes(lengths) / lengths).min())
        if high is None and memory.per_token_squared == 0:
            per_token = min(per_token, memory.per_token)  # the longest sequences, as long as any
        if per_token <= 0:
            return math.inf
        return max(0.0, (byte_cap - memory.fixed) / per_token)
