"""Calibration: time probe micro-batches of the user's step and fit seconds on their lengths.

The probes are the memory calibration's shapes (:func:`seqbal.memory.default_probes`): at
each token total, ``long`` (sequences as long as allowed: the squared term at its largest),
``short`` (many short sequences: the per-sequence term), ``mixed`` (one half-total sequence and
eighths), and with the user's lengths ``sampled`` (drawn from them: the micro-batches that
will really run). Token totals halve from ``max_token_len``, the largest micro-batch a plan
will make, so the fit covers the range plans use and never extrapolates past it; halving
spreads the probes over that range in ``log2`` steps, and the small ones pin the fixed and
per-sequence terms that dominate small micro-batches.

Time of a probe is the fastest of ``repeats`` timed calls (:mod:`.clock`); before any probe
is timed, ``warmup`` untimed calls of the largest probe pay for lazy initialisation (kernel
selection, workspaces, the allocator's first growth), which is not the step's time. The
warm-up calls are not probes, and are counted apart in :meth:`TimeCalibration.explain`.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ...quadratic_workload import QuadraticWorkload
from ..memory.calibration import default_probes
from .model import FEATURES, TimeModel, features, fit

__all__ = ["TimedProbe", "TimeCalibration", "calibrate", "fit_probes", "MAX_PROBES"]

#: Format tag of the JSON file :meth:`TimeCalibration.save` writes.
FORMAT = "seqbal.timing.calibration/1"
#: The default maximum of probes; ``calibrate`` takes at most this many unless told otherwise.
MAX_PROBES = 24
#: Micro-batch size probed when no ``max_token_len`` is given (and no length is longer).
DEFAULT_MAX_TOKEN_LEN = 4096


@dataclass(frozen=True)
class TimedProbe:
    """One timed micro-batch: its lengths and seconds (a probe, or a record of a training run).

    Attributes:
        lengths: the micro-batch's sequence lengths.
        seconds: its time (the fastest of the repeats, for a probe).
        shape: ``long``, ``short``, ``mixed``, ``sampled``, ``given`` (a probe) or ``recorded``.
    """

    lengths: tuple[int, ...]
    seconds: float
    shape: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "lengths": list(self.lengths), "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TimedProbe":
        return cls(tuple(int(s) for s in data["lengths"]), float(data["seconds"]), str(data.get("shape", "")))


@dataclass(frozen=True)
class TimeCalibration:
    """A fitted time model and what it was fitted on.

    Attributes:
        model: the fitted :class:`TimeModel` (seconds of one micro-batch).
        probes: the timed micro-batches it was fitted on (probes, or a run's records).
        device: where they ran (``"cpu"``, ``"cuda:0"``, or ``"ranks:4"`` for pooled records).
        clock: what measured them (``"cuda events"``, ``"thread cpu time"``, ``"custom timer"``,
            ``"recorded"``).
        repeats: timed calls per probe (the fastest kept); 1 for records.
        warmup: untimed calls before the first probe.
        source: ``"probes"`` (:func:`calibrate`) or ``"recorder"`` (:class:`Recorder`).

    Examples:
        >>> cal = TimeCalibration(TimeModel(fixed=1e-3, per_token=1e-6, per_token_squared=1e-9))
        >>> round(cal.predict([1000, 1000]), 6)  # 1 ms + 2 ms + 2 ms
        0.005
        >>> from seqbal import build_dp_schedule
        >>> schedule = build_dp_schedule([4000, 10, 10, 1000, 1000, 1000], 2, 4096, workload_fn=cal.workload_fn)
    """

    model: TimeModel
    probes: tuple[TimedProbe, ...] = field(default=())
    device: str = "cpu"
    clock: str = ""
    repeats: int = 1
    warmup: int = 0
    source: str = "probes"

    def __post_init__(self) -> None:
        object.__setattr__(self, "probes", tuple(self.probes))

    def predict(self, lengths: Sequence[int]) -> float:
        """Predicted seconds of one micro-batch of these lengths. O(n)."""
        return self.model.predict(lengths)

    @property
    def workload_fn(self) -> QuadraticWorkload:
        """lengths -> int64 workloads proportional to each sequence's predicted seconds (the
        per-micro-batch ``fixed`` term left out: every rank pays it per micro-batch alike), for
        ``build_dp_schedule(workload_fn=...)`` and every planner that takes one."""
        return self.model.workload_fn

    @property
    def largest_tokens(self) -> int:
        """Tokens of the largest micro-batch timed (0 when none): predictions past it extrapolate."""
        return max((sum(p.lengths) for p in self.probes), default=0)

    def probe_errors(self) -> list[float]:
        """Relative error of the fit on each timed micro-batch (prediction / seconds - 1)."""
        return [self.predict(p.lengths) / p.seconds - 1 for p in self.probes if p.seconds > 0]

    def explain(self) -> str:
        """One paragraph: what was timed and how, the fitted terms, and the fit's quality."""
        m = self.model
        what = (f"{len(self.probes)} probe micro-batches" if self.source == "probes"
                else f"{len(self.probes)} recorded micro-batches")
        how = self.clock or "an unnamed clock"
        if self.source == "probes":
            how += f", fastest of {self.repeats} call(s) each after {self.warmup} untimed warm-up call(s)"
        terms = (f"seconds = {_time(m.fixed)} + {_time(m.per_sequence)} per sequence + {_time(m.per_token)} per token "
                 f"+ {_time(m.per_token_squared)} per token^2")
        text = f"time model from {what} of up to {self.largest_tokens:,} tokens on {self.device} ({how}): {terms}"
        errors = [abs(e) for e in self.probe_errors()]
        if errors:
            text += f"; within {statistics.median(errors):.1%} median, {max(errors):.1%} worst of them"
        longest = max((max(p.lengths) for p in self.probes), default=0)
        if longest and m.sequence_seconds(longest) > 0:
            share = m.per_token_squared * float(longest) ** 2 / m.sequence_seconds(longest)
            text += f"; attention's squared term is {share:.0%} of a {longest:,}-token sequence's time"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "source": self.source, "device": self.device, "clock": self.clock,
            "repeats": self.repeats, "warmup": self.warmup,
            "model": {name: getattr(self.model, name) for name in FEATURES},
            "workload_fn": self.workload_fn.coefficients if self.model.sequence_seconds(1) > 0 else None,
            "probes": [p.to_dict() for p in self.probes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TimeCalibration":
        """Raises ValueError on anything but :meth:`to_dict`'s output."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a seqbal time calibration (expected format {FORMAT!r}, got "
                             f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r})")
        try:
            return cls(TimeModel(**{name: float(data["model"][name]) for name in FEATURES}),
                       tuple(TimedProbe.from_dict(p) for p in data.get("probes", [])), str(data.get("device", "")),
                       str(data.get("clock", "")), int(data.get("repeats", 1)), int(data.get("warmup", 0)),
                       str(data.get("source", "probes")))
        except (KeyError, TypeError, IndexError) as error:
            raise ValueError(f"malformed seqbal time calibration: {type(error).__name__}: {error}") from None

    def save(self, path: Union[str, Path]) -> None:
        """Write :meth:`to_dict` as JSON (floats written exactly: ``load`` gives the same model)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Union[str, Path]) -> "TimeCalibration":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read time calibration {path}: {error}") from None
        return cls.from_dict(data)


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-12:.3g} ps" if seconds else "0"


def fit_probes(probes: Sequence[TimedProbe], **fields: Any) -> TimeCalibration:
    """Fit :class:`TimeModel` on timed micro-batches; ``fields`` go to :class:`TimeCalibration`.

    Raises:
        ValueError: fewer than two timed micro-batches, or a time that is not positive.
    """
    probes = tuple(probes)
    if len(probes) < 2:
        raise ValueError(f"a time model needs at least 2 timed micro-batches, got {len(probes)}")
    bad = [p for p in probes if not p.seconds > 0]
    if bad:
        raise ValueError(f"{len(bad)} timed micro-batch(es) took {bad[0].seconds} s (lengths {list(bad[0].lengths)[:4]}): "
                         f"times must be positive; is the clock measuring the step's thread and device?")
    rows = np.array([features(p.lengths) for p in probes])
    coefficients = fit(rows, np.array([p.seconds for p in probes], dtype=np.float64))
    return TimeCalibration(TimeModel.from_coefficients(coefficients), probes, **fields)


def probe_plan(max_token_len: int, lengths: Optional[Sequence[int]], probes: int, start: int) -> list[tuple[str, list[int]]]:
    """The probe micro-batches, largest scale first: token totals halving from
    ``max_token_len`` down to ``start``, every shape at each, at most ``probes`` in all. O(probes * max_token_len / shortest)."""
    out: list[tuple[str, list[int]]] = []
    tokens, scale = max_token_len, 0
    while len(out) < probes and tokens >= start:
        for shape, candidate in default_probes(tokens, lengths, seed=scale).items():
            if len(out) < probes and candidate not in [c for _, c in out]:
                out.append((shape, candidate))
        tokens //= 2
        scale += 1
    return out


def calibrate(
    step_fn: Callable[[list[int]], Any],
    *,
    lengths: Optional[Sequence[int]] = None,
    max_token_len: Optional[int] = None,
    probes: Union[int, Sequence[Sequence[int]]] = MAX_PROBES,
    repeats: int = 3,
    warmup: int = 1,
    start: int = 64,
    device: Optional[Any] = None,
    timer: Optional[Callable[[Callable[[], Any]], float]] = None,
) -> TimeCalibration:
    """Time ``step_fn`` on probe micro-batches and fit seconds on their lengths.

    Args:
        step_fn: ``step_fn(lengths)`` runs one forward and backward of the user's model on a
            synthetic micro-batch with sequences of these lengths, on the device to calibrate
            (the contract of :func:`seqbal.memory.calibrate`; an optimizer step may be left out,
            it is paid once per step whatever the plan).
        lengths: the user's length distribution: probes use sequences within its range and one
            probe per scale is drawn from it. Default None: any lengths.
        max_token_len: the largest micro-batch plans will make, in tokens (the cap): the largest
            probe. Default: 4096, or the longest of ``lengths`` if longer.
        probes: the most probes to time (default 24), or the exact probe micro-batches.
        repeats: timed calls per probe; the fastest is kept (default 3).
        warmup: untimed calls of the largest probe before any is timed (default 1).
        start: smallest token total probed (default 64).
        device: where the clock looks (default: CUDA if available, else the CPU).
        timer: ``timer(step) -> seconds`` of one call; default :func:`time_step` on ``device``
            (CUDA events, or the thread's CPU time). Repeats and warm-up apply to it alike.

    Returns:
        A :class:`TimeCalibration`: ``.predict(lengths)`` (seconds of one micro-batch),
        ``.workload_fn`` (for ``build_dp_schedule(workload_fn=...)``), ``.explain()``, ``.save``.

    Raises:
        ValueError: bad arguments (a length longer than ``max_token_len`` included), or a
            probe whose time is not positive.

    Complexity: ``warmup + repeats * probes`` calls of ``step_fn``, the largest of
    ``max_token_len`` tokens and each scale half the one before, so about ``2 * repeats +
    warmup`` calls of the largest per shape; plus a fit of O(16 * probes).

    Examples:
        >>> def step(lengths):  # a stand-in: any callable that runs a micro-batch
        ...     sum(s * s for s in lengths for _ in range(20))
        >>> cal = calibrate(step, max_token_len=1024, probes=8, timer=lambda run: run() or 1.0)
        >>> len(cal.probes), cal.source
        (8, 'probes')
    """
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("start", start, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    pool = None
    if lengths is not None:
        pool = [int(s) for s in np.asarray(lengths).ravel()]
        if not pool or min(pool) < 1:
            raise ValueError(f"lengths must be one or more lengths >= 1, got {len(pool)} with smallest "
                             f"{min(pool) if pool else None}")
    if max_token_len is None:
        max_token_len = max(DEFAULT_MAX_TOKEN_LEN, max(pool) if pool else 0)
    if isinstance(max_token_len, bool) or not isinstance(max_token_len, (int, np.integer)) or max_token_len < 1:
        raise ValueError(f"max_token_len must be a positive int of tokens, got {max_token_len!r}")
    max_token_len = int(max_token_len)
    if pool and max(pool) > max_token_len:
        raise ValueError(f"a length of {max(pool)} tokens exceeds max_token_len {max_token_len}: no plan could hold it")
    if isinstance(probes, (int, np.integer)) and not isinstance(probes, bool):
        if probes < 4:
            raise ValueError(f"probes must be at least 4 (one per feature of the time model), got {probes}")
        plan = probe_plan(max_token_len, pool, int(probes), min(int(start), max_token_len))
    else:
        plan = [("given", [int(s) for s in probe]) for probe in probes]
        for _, candidate in plan:
            features(candidate)  # ValueError on an empty probe or a length < 1
        if len(plan) < 2:
            raise ValueError(f"a time model needs at least 2 probes, got {len(plan)}")
    largest = max(plan, key=lambda item: (sum(item[1]), len(item[1])))[1]
    for _ in range(warmup):
        step_fn(list(largest))
    plan.sort(key=lambda item: sum(item[1]))  # small to large: a failure costs least early
    done = [timed_probe(step_fn, candidate, shape, device=device, timer=timer, repeats=repeats) for shape, candidate in plan]
    return fit_probes(done, **timing_fields(device, timer, repeats, warmup))


def timed_probe(step_fn: Callable[[list[int]], Any], candidate: Sequence[int], shape: str, *, device: Optional[Any],
                timer: Optional[Callable[[Callable[[], Any]], float]], repeats: int) -> TimedProbe:
    """One probe timed: the fastest of ``repeats`` calls, by ``timer`` or the device's clock.
    Shared with :func:`seqbal.memory.calibrate` (``time=True``)."""
    lengths = [int(s) for s in candidate]
    if timer is None:
        from .clock import time_step

        seconds = time_step(lambda: step_fn(list(lengths)), device, repeats=repeats)
    else:
        seconds = min(float(timer(lambda: step_fn(list(lengths)))) for _ in range(repeats))
    return TimedProbe(tuple(lengths), seconds, shape)


def timing_fields(device: Optional[Any], timer: Optional[Any], repeats: int, warmup: int) -> dict[str, Any]:
    """The :class:`TimeCalibration` fields that say how probes were timed."""
    if timer is None:
        from .clock import clock_name

        return dict(device=_device_name(device), clock=clock_name(device), repeats=repeats, warmup=warmup,
                     source="probes")
    return dict(device=str(device or "cpu"), clock="custom timer", repeats=repeats, warmup=warmup, source="probes")


def _device_name(device: Optional[Any]) -> str:
    import torch

    if device is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return str(torch.device(device))
