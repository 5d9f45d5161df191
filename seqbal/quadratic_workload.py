"""A workload model with named integer coefficients: ``per_sequence + per_token * s +
per_token_squared * s**2`` for a sequence of ``s`` tokens.

Both measured workloads use it: the FLOPs of a transformers config
(:func:`seqbal.workload_from_config`) and the seconds of a timing calibration
(:func:`seqbal.timing.calibrate`, :class:`seqbal.timing.Recorder`). It is the
``workload_fn`` contract of :func:`seqbal.build_dp_schedule` (lengths -> non-negative int64)
with its coefficients inspectable. Integers, not floats, so that a plan is the same on every
machine and every rank: a float model rounded per sample could round differently after a
harmless reordering. The workloads are the formula divided by the coefficients' greatest common
divisor (``unit``), still exact, so that large FLOP counts leave room for int64 sums over a
batch. A frozen dataclass, so two ranks' models compare equal exactly when their coefficients do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .validation import INT64_SAFE_TOTAL, int_argument, int_array

__all__ = ["QuadraticWorkload"]


@dataclass(frozen=True)
class QuadraticWorkload:
    """``workload(s) = (per_sequence + per_token * s + per_token_squared * s**2) // unit``, exact
    int64 (``unit`` = the gcd of the three coefficients, so the division is exact).

    Attributes:
        per_sequence: cost of a sequence of any length (int >= 0).
        per_token: cost of each token (int >= 0).
        per_token_squared: cost of each squared token (attention's pairs; int >= 0).
        what: what one unit of the coefficients is (``"FLOPs"``, ``"picoseconds"``), for reports.

    Examples:
        >>> w = QuadraticWorkload(0, 24576, 1)
        >>> w([1, 1000]).tolist()  # seqbal's default model, 24576 s + s**2
        [24577, 25576000]
        >>> QuadraticWorkload(0, 40, 2)([3]).tolist(), QuadraticWorkload(0, 40, 2).unit  # (120 + 18) / 2
        ([69], 2)
    """

    per_sequence: int
    per_token: int
    per_token_squared: int
    what: str = ""

    def __post_init__(self) -> None:
        for name in ("per_sequence", "per_token", "per_token_squared"):
            object.__setattr__(self, name, int_argument(name, getattr(self, name), minimum=0,
                                                        expected="an int >= 0"))
        if not (self.per_sequence or self.per_token or self.per_token_squared):
            raise ValueError("a workload needs a positive coefficient: per_sequence, per_token and "
                             "per_token_squared are all 0")

    @property
    def unit(self) -> int:
        """The greatest common divisor of the coefficients: the workloads are the formula over it."""
        return math.gcd(self.per_sequence, self.per_token, self.per_token_squared)

    @property
    def coefficients(self) -> dict[str, int]:
        """``{"per_sequence": ..., "per_token": ..., "per_token_squared": ...}`` (before ``unit``)."""
        return {"per_sequence": self.per_sequence, "per_token": self.per_token,
                "per_token_squared": self.per_token_squared}

    def longest(self) -> int:
        """The longest length whose workload fits :data:`INT64_SAFE_TOTAL` (sums stay exact). O(log)."""
        a, b, c = (v // self.unit for v in (self.per_sequence, self.per_token, self.per_token_squared))
        if c:
            high = math.isqrt(INT64_SAFE_TOTAL // c) + 1
        elif b:
            high = INT64_SAFE_TOTAL // b + 1
        else:
            return 2**62
        low = 0
        while high - low > 1:
            middle = (low + high) // 2
            if a + b * middle + c * middle * middle <= INT64_SAFE_TOTAL:
                low = middle
            else:
                high = middle
        return low

    def __call__(self, seqlens: Any) -> Any:
        """Workloads of these lengths (a tensor stays a tensor, anything else gives an int64
        array). O(n).

        Raises:
            ValueError: a negative or non-integer length, or one longer than :meth:`longest`.
        """
        unit = self.unit
        a, b, c = self.per_sequence // unit, self.per_token // unit, self.per_token_squared // unit
        if type(seqlens).__module__.startswith("torch") and hasattr(seqlens, "long"):
            values = int_array(seqlens.reshape(-1), "seqlens", negative=False, sums=False)
            self._check(values)
            s = seqlens.long()
            return a + b * s + c * s * s
        array = np.asarray(seqlens)
        s = int_array(array.reshape(-1), "seqlens", negative=False, sums=False).reshape(array.shape)
        self._check(s)
        return (a + b * s + c * s * s).astype(np.int64)

    def _check(self, values: np.ndarray) -> None:
        if values.size and int(values.max()) > self.longest():
            raise ValueError(f"a length of {int(values.max())} tokens is beyond this workload's exact range "
                             f"(at most {self.longest()} tokens for {self})")

    def __str__(self) -> str:
        unit = f" {self.what}" if self.what else ""
        return f"{self.per_sequence} + {self.per_token} * s + {self.per_token_squared} * s^2{unit} per sequence"
