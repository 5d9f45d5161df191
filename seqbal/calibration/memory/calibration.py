"""Calibration: probe the user's step, fit peak bytes, and turn a memory budget into a cap.

The probes are few and chosen to separate the model's features (:mod:`.model`): at token
totals ``T`` doubling from ``start``, three shapes move different features at once: ``long``
(sequences as long as allowed: the squared and longest terms at their largest), ``short``
(many short sequences: the per-sequence term), and ``mixed`` (one half-``T`` sequence and
eighths: the longest term apart from the sum of squares); with the user's lengths, a fourth
drawn from them (the micro-batches that will really run). Doubling reaches the budget in
``log2(budget / start)`` scales and spreads the probes over the range the fit must cover.

Probing never runs a micro-batch predicted to exceed the budget less the margin (the margin
covers the error of a fit still extrapolating). Before the fit has enough probes (four), the
prediction is a bound: no feature grows more than four times when ``T`` doubles (the largest
is quadratic), so four times the same shape's peak at ``T / 2`` bounds its peak at ``T``.
After that, it is the current fit. An out-of-memory error during a probe
(``torch.OutOfMemoryError``, ``MemoryError``) is caught and recorded, that shape stops
growing, and the fit uses the probes that ran.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from ...cost import CostModel
from .model import FEATURES, MemoryModel, features, fit

if TYPE_CHECKING:
    from ..timing import TimeCalibration

__all__ = ["Calibration", "Probe", "calibrate", "default_probes"]

#: Format tag of the JSON file :meth:`Calibration.save` writes.
FORMAT = "seqbal.memory.calibration/1"
#: Probes the fit needs before it, not the growth bound, decides what may run.
FIT_AFTER = 4
#: With ``time=True``: timed calls per probe, the fastest kept.
TIME_REPEATS = 3
#: Shortest sequence the ``short`` probes use, and how many sequences they hold at most.
SHORT_LENGTH, SHORT_COUNT = 16, 64


@dataclass(frozen=True)
class Probe:
    """One metered probe: its lengths, and its peak bytes or why it has none.

    Attributes:
        lengths: the micro-batch's sequence lengths.
        peak_bytes: the metered peak, or None when it did not run to the end.
        error: ``""`` when metered; ``"out of memory: ..."`` when it ran out of memory.
        shape: which probe family it belongs to (``long``, ``short``, ``mixed``, ``sampled``,
            ``given``).
    """

    lengths: tuple[int, ...]
    peak_bytes: Optional[int]
    error: str = ""
    shape: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "lengths": list(self.lengths), "peak_bytes": self.peak_bytes, "error": self.error}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Probe":
        peak = data.get("peak_bytes")
        return cls(tuple(int(s) for s in data["lengths"]), None if peak is None else int(peak),
                   str(data.get("error", "")), str(data.get("shape", "")))


def _pieces(total: int, piece: int) -> list[int]:
    """``total`` tokens as sequences of ``piece`` (the last one shorter, if any is left)."""
    piece = max(1, min(piece, total))
    out = [piece] * (total // piece)
    if total % piece:
        out.append(total % piece)
    return out


def default_probes(
    tokens: int, lengths: Optional[Sequence[int]] = None, *, seed: int = 0
) -> dict[str, list[int]]:
    """The probe micro-batches at a token total of ``tokens``, by shape (module docstring).

    With ``lengths``, sequences are at most the longest of them and a ``sampled`` probe is drawn
    from them (seeded, at most ``tokens`` tokens). O(tokens / shortest piece).

    >>> default_probes(256)
    {'long': [256], 'short': [16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16], 'mixed': [128, 32, 32, 32, 32]}
    """
    longest = tokens if lengths is None else min(tokens, int(max(lengths)))
    short = max(SHORT_LENGTH, -(-tokens // SHORT_COUNT))
    if lengths is not None:
        short = max(min(short, longest), int(min(lengths)))
    probes = {
        "long": _pieces(tokens, longest),
        "short": _pieces(tokens, short),
        "mixed": [min(tokens // 2, longest)] + _pieces(tokens - min(tokens // 2, longest), min(max(tokens // 8, 1), longest)),
    }
    if lengths is not None:
        rng = np.random.default_rng(seed)
        pool = np.asarray(lengths, dtype=np.int64)
        drawn, total = [], 0
        for value in rng.choice(pool, size=min(len(pool) * 4, 4 * tokens // max(int(pool.min()), 1) + 1)).tolist():
            if total + value > tokens:
                break
            drawn.append(value)
            total += value
        if drawn:
            probes["sampled"] = sorted(drawn, reverse=True)
    return {name: [int(s) for s in probe if s > 0] for name, probe in probes.items() if probe}


@dataclass(frozen=True)
class Calibration:
    """A fitted memory model, a budget, and the token cap and byte cost derived from them.

    Attributes:
        model: the fitted :class:`MemoryModel` (peak bytes of a micro-batch).
        memory_budget: bytes a micro-batch may peak at (on CUDA, absolute, parameters
            included; on the CPU, the bytes the step adds: see :func:`measure_peak`).
        margin: fraction of the budget kept free for what the model misses (allocator
            fragmentation, fit error); the cap plans against ``byte_cap``.
        length_range: ``(shortest, longest)`` of the user's lengths, or None (any lengths).
        probes: every probe, metered or not, in the order run.
        device: where the probes ran (``"cpu"``, ``"cuda:0"``).
        timing: with ``calibrate(..., time=True)``, the time model fitted on the same probes
            (:class:`seqbal.timing.TimeCalibration`); None otherwise.

    Examples:
        >>> cal = Calibration(MemoryModel(fixed=1e6, per_token=1e3, per_token_squared=1.0), 10_000_000, margin=0.1)
        >>> cal.byte_cap, cal.max_token_len  # one sequence of 2,372 tokens: 1e6 + 2.372e6 + 5.626e6 bytes
        (9000000, 2372)
        >>> cal.predict([1000, 1000]) <= cal.byte_cap
        True
    """

    model: MemoryModel
    memory_budget: int
    margin: float = 0.1
    length_range: Optional[tuple[int, int]] = None
    probes: tuple[Probe, ...] = field(default=())
    device: str = "cpu"
    timing: Optional["TimeCalibration"] = None

    def __post_init__(self) -> None:
        if isinstance(self.memory_budget, bool) or not isinstance(self.memory_budget, (int, np.integer)) or self.memory_budget < 1:
            raise ValueError(f"memory_budget must be a positive int of bytes, got {self.memory_budget!r}")
        object.__setattr__(self, "memory_budget", int(self.memory_budget))
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 <= self.margin < 1:
            raise ValueError(f"margin must be a fraction in [0, 1), got {self.margin!r}")
        if self.length_range is not None:
            low, high = (int(v) for v in self.length_range)
            if not 1 <= low <= high:
                raise ValueError(f"length_range must be (shortest, longest) with 1 <= shortest <= longest, got {self.length_range!r}")
            object.__setattr__(self, "length_range", (low, high))
        object.__setattr__(self, "probes", tuple(self.probes))

    @property
    def byte_cap(self) -> int:
        """The budget less the margin: what every planned micro-batch's prediction stays under."""
        return int(math.floor(self.memory_budget * (1.0 - self.margin)))

    @property
    def max_token_len(self) -> int:
        """The largest token cap whose worst micro-batch (lengths in ``length_range``, or any
        lengths) is predicted within :attr:`byte_cap`; 0 when even the shortest sequence is not."""
        return self.model.max_token_len(self.byte_cap, self.length_range)

    def worst_case(self, tokens: Optional[int] = None) -> tuple[int, list[int]]:
        """Predicted bytes and lengths of the worst micro-batch of at most ``tokens`` (default
        :attr:`max_token_len`) tokens."""
        return self.model.worst_case(self.max_token_len if tokens is None else tokens, self.length_range)

    def predict(self, lengths: Sequence[int]) -> int:
        """Predicted peak bytes of one micro-batch of these lengths."""
        return self.model.predict(lengths)

    @property
    def cost_model(self) -> CostModel:
        """A :class:`seqbal.CostModel` of predicted bytes (never below :meth:`predict`): plan
        with ``max_token_len=calibration.byte_cap, cost_model=calibration.cost_model``."""
        return self.model.cost_model()

    def explain(self) -> str:
        """One paragraph: the cap chosen, the micro-batch that sets it, and the fit's quality."""
        cap = self.max_token_len
        worst, example = self.worst_case()
        spread = "any lengths" if self.length_range is None else (
            f"lengths {self.length_range[0]}..{self.length_range[1]}")
        shape = _describe(example)
        errors = self.probe_errors()
        fit_note = (f"; the fit is within {max(map(abs, errors)):.1%} of its {len(errors)} metered probes"
                    if errors else "")
        failed = sum(1 for p in self.probes if p.peak_bytes is None)
        oom_note = f"; {failed} probe(s) ran out of memory" if failed else ""
        return (
            f"max_token_len {cap}: the worst micro-batch of {cap} tokens ({spread}) is {shape}, predicted "
            f"{_size(worst)}, within the budget {_size(self.memory_budget)} less a {self.margin:.0%} margin "
            f"({_size(self.byte_cap)}){fit_note}{oom_note}"
        )

    def probe_errors(self) -> list[float]:
        """Relative error of the fit on each metered probe (prediction / peak - 1)."""
        return [self.predict(p.lengths) / p.peak_bytes - 1 for p in self.probes if p.peak_bytes]

    def rebudget(self, memory_budget: Optional[int] = None, *, lengths: Optional[Sequence[int]] = None,
                 margin: Optional[float] = None) -> "Calibration":
        """The same fit under another budget, margin or length distribution."""
        return Calibration(
            self.model,
            self.memory_budget if memory_budget is None else memory_budget,
            self.margin if margin is None else margin,
            _length_range(lengths) if lengths is not None else self.length_range,
            self.probes,
            self.device,
            self.timing,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "device": self.device,
            "memory_budget": self.memory_budget,
            "margin": self.margin,
            "length_range": None if self.length_range is None else list(self.length_range),
            "model": {name: getattr(self.model, name) for name in FEATURES},
            "max_token_len": self.max_token_len,
            "probes": [p.to_dict() for p in self.probes],
            **({"timing": self.timing.to_dict()} if self.timing is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Calibration":
        """Raises ValueError on anything but :meth:`to_dict`'s output."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a seqbal calibration (expected format {FORMAT!r}, got "
                             f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r})")
        try:
            model = MemoryModel(**{name: float(data["model"][name]) for name in FEATURES})
            probes = tuple(Probe.from_dict(p) for p in data.get("probes", []))
            length_range = data.get("length_range")
            return cls(model, int(data["memory_budget"]), float(data["margin"]),
                       None if length_range is None else (int(length_range[0]), int(length_range[1])),
                       probes, str(data.get("device", "")), _timing_from(data.get("timing")))
        except (KeyError, TypeError, IndexError) as error:
            raise ValueError(f"malformed seqbal calibration: {type(error).__name__}: {error}") from None

    def save(self, path: Union[str, Path]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Calibration":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read calibration {path}: {error}") from None
        return cls.from_dict(data)


def _size(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def _describe(lengths: list[int]) -> str:
    if not lengths:
        return "empty"
    runs: list[tuple[int, int]] = []
    for s in lengths:
        if runs and runs[-1][0] == s:
            runs[-1] = (s, runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return " + ".join(f"{count} x {s}" if count > 1 else f"1 x {s}" for s, count in runs)


def _length_range(lengths: Sequence[int]) -> tuple[int, int]:
    array = np.asarray(lengths, dtype=np.int64).ravel()
    if array.size == 0:
        raise ValueError("lengths is empty: pass None for any distribution")
    positive = array[array > 0]
    if positive.size == 0:
        raise ValueError("lengths has no positive length")
    return int(positive.min()), int(positive.max())


def calibrate(
    step_fn: Callable[[list[int]], Any],
    memory_budget: int,
    *,
    lengths: Optional[Sequence[int]] = None,
    probes: Union[int, Sequence[Sequence[int]]] = 24,
    margin: float = 0.1,
    start: int = 64,
    device: Optional[Any] = None,
    meter: Optional[Callable[[Callable[[], Any]], int]] = None,
    time: bool = False,
    timer: Optional[Callable[[Callable[[], Any]], float]] = None,
) -> Calibration:
    """Meter ``step_fn`` on probe micro-batches, fit peak bytes, and derive a cap for the budget.

    Args:
        step_fn: ``step_fn(lengths)`` runs one forward and backward of the user's model on a
            synthetic micro-batch with sequences of these lengths, on the device to calibrate,
            and leaves the state as it found it (gradients set to None, no optimizer step).
        memory_budget: bytes a micro-batch may peak at (see :class:`Calibration`).
        lengths: the user's length distribution (any sequence of ints); the cap is then the
            worst case over micro-batches of lengths within its range, and one probe per scale
            is drawn from it. Default None: any lengths.
        probes: the most probes to run (default 24), or the exact probe micro-batches (each
            still skipped when predicted over the budget).
        margin: fraction of the budget kept free (default 0.1, the accuracy the model is
            measured to reach: docs/memory.md).
        start: token total of the first scale (default 64).
        device: where the meter looks (default: CUDA if available, else the CPU).
        meter: ``meter(step) -> peak bytes``; default :func:`seqbal.memory.measure_peak` on ``device``.
        time: also time every metered probe (the fastest of 3 calls, after its metering: the
            meter's profiler would slow the step it times) and fit the time model on them, as
            :func:`seqbal.timing.calibrate` does; the result is ``.timing``. Default False.
        timer: with ``time``, ``timer(step) -> seconds``; default :func:`seqbal.timing.time_step`
            on ``device`` (CUDA events, or the thread's CPU time).

    Returns:
        A :class:`Calibration`; ``.max_token_len``, ``.predict(lengths)``, ``.cost_model``.

    Raises:
        ValueError: bad arguments, or fewer than two probes could be metered (the smallest
            ran out of memory, or the budget admits none).

    Complexity: at most ``probes`` runs of ``step_fn`` (each metered), plus O(probes * 64) for
    the fit.
    """
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)) or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive int of bytes, got {memory_budget!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise ValueError(f"start must be a positive int of tokens, got {start!r}")
    length_range = None if lengths is None else _length_range(lengths)
    pool = None if lengths is None else [int(s) for s in np.asarray(lengths).ravel() if s > 0]
    if meter is None:
        from .meter import measure_peak

        def meter(step: Callable[[], Any]) -> int:
            return measure_peak(step, device)
    from .meter import _oom_types

    oom = _oom_types()
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"margin must be a fraction in [0, 1), got {margin!r}")
    budget = int(math.floor(int(memory_budget) * (1.0 - margin)))  # what a probe may be predicted at
    done: list[Probe] = []
    timed: list[Any] = []  # with time=True: a TimedProbe per metered probe
    if time:
        from ..timing.calibration import timed_probe

        def clock(candidate: list[int], shape: str) -> Any:
            return timed_probe(step_fn, candidate, shape, device=device, timer=timer, repeats=TIME_REPEATS)

    def predicted(candidate: list[int], bound: Optional[int]) -> Optional[float]:
        ok = [p for p in done if p.peak_bytes]
        if len(ok) >= FIT_AFTER:
            rows = np.array([features(p.lengths) for p in ok])
            return float(features(candidate) @ fit(rows, np.array([p.peak_bytes for p in ok], dtype=np.float64)))
        return bound

    def run(candidate: list[int], shape: str) -> Probe:
        try:
            peak = meter(lambda: step_fn(list(candidate)))
            probe = Probe(tuple(candidate), int(peak), "", shape)
            if time:
                timed.append(clock(candidate, shape))
        except oom as error:
            probe = Probe(tuple(candidate), None, f"out of memory: {type(error).__name__}: {str(error)[:200]}", shape)
            _release_cache()
        done.append(probe)
        return probe

    if isinstance(probes, int) and not isinstance(probes, bool):
        if probes < 2:
            raise ValueError(f"probes must be at least 2, got {probes}")
        limit = probes
        last: dict[str, Optional[int]] = {}  # shape -> peak at the previous scale (None: stopped)
        tokens, first = start, True
        while len(done) < limit:
            candidates = default_probes(tokens, pool, seed=len(done))
            ran = False
            for shape, candidate in candidates.items():
                if len(done) >= limit or (shape in last and last[shape] is None):
                    continue
                bound = None if shape not in last else 4 * last[shape]
                guess = predicted(candidate, bound)
                if guess is not None and guess > budget:
                    last[shape] = None
                    continue
                if first:  # a warm-up run first: lazy initialisation (kernels, workspaces) is not the step's
                    first = False
                    try:
                        step_fn(list(candidate))
                    except oom:
                        _release_cache()
                probe = run(candidate, shape)
                last[shape] = probe.peak_bytes
                ran = True
            if not ran:
                break
            tokens *= 2
    else:
        given = [[int(s) for s in probe] for probe in probes]
        for index, candidate in enumerate(given):
            if index == 0:
                try:
                    step_fn(list(candidate))
                except oom:
                    _release_cache()
            guess = predicted(candidate, None)
            if guess is not None and guess > budget:
                done.append(Probe(tuple(candidate), None,
                             f"skipped: predicted {guess:.0f} bytes > budget less margin {budget}", "given"))
                continue
            run(candidate, "given")
    metered = [p for p in done if p.peak_bytes]
    if len(metered) < 2:
        raise ValueError(
            f"calibration metered {len(metered)} probe(s) under the budget less margin, {budget} bytes (of {len(done)} tried: "
            + "; ".join(f"{list(p.lengths)[:4]}: {p.error or p.peak_bytes}" for p in done[:4])
            + "): raise memory_budget or lower start"
        )
    coefficients = fit(np.array([features(p.lengths) for p in metered]),
                       np.array([p.peak_bytes for p in metered], dtype=np.float64))
    timing = None
    if time:
        from ..timing.calibration import fit_probes, timing_fields

        timing = fit_probes(timed, **timing_fields(device, timer, TIME_REPEATS, 1))
    return Calibration(MemoryModel.from_coefficients(coefficients), int(memory_budget), margin, length_range, tuple(done),
                       _device_name(device), timing)


def _timing_from(data: Optional[dict[str, Any]]) -> Optional["TimeCalibration"]:
    if data is None:
        return None
    from ..timing import TimeCalibration

    return TimeCalibration.from_dict(data)


def _release_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _device_name(device: Optional[Any]) -> str:
    import torch

    if device is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return str(torch.device(device))
