"""Calibration: probe the user's step up to the budget, fit peak bytes, and turn the budget into a cap.

Probing climbs a ladder of token totals, one per shape (:mod:`.probes`), until each shape's
next probe is predicted over the budget less the margin, so the largest probes are at the
scale of the budget (or of every one of the user's lengths at once, the longest micro-batch
they allow): a cap fitted from small probes alone is an extrapolation, and a peak that departs
from the fitted form by a few percent at small scale can be several times the budget at a
large one. The ``long`` shape climbs at every rung (it finds the scale); the other shapes run
at the first rung and again near their own top (within 8x of the tokens where the current fit
puts them at the budget), which is where the micro-batches a plan packs lie. A rung is 4x
while the current fit has 16x of headroom, 2x after that: a quadratic term the fit has not yet
seen grows 16x in a 4x step, and the fit's 16x look-ahead already covers that much. When a
shape's next rung is predicted over (or runs over), one last probe of it runs at the largest
total in between that the fit predicts within, and halfway down from there if that one does
not fit: the top probes lie near the budget, above the micro-batches that plans pack (whose
cap is lower: :attr:`Calibration.byte_cap`). No probe holds more than 4x the tokens of the
largest one that ran within the budget, whatever the fit predicts.

The first rung (``start`` tokens, and ``start / 2`` for the ``long`` shape) always runs: it is
what the fit starts from. After it, a probe runs only when the current fit predicts it within
the budget less the margin. An out-of-memory error during a probe (``torch.OutOfMemoryError``,
``MemoryError``) is caught and recorded, that shape stops climbing, and the fit uses the probes
that ran.

Why the cap is ``budget x (1 - margin) / (1 + margin)``: the margin is the departure of the
true peak from the fitted form that the plans tolerate, either way. The fit is raised to lie at
or above the probes of the upper range (:func:`.model.envelope`), which may each be up to the
margin under the form; a planned micro-batch may be up to the margin over it. Both together
stay within the budget at that cap (docs/memory.md).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from ...cost import CostModel
from .model import FEATURES, MAX_CAP_TOKENS, MemoryModel, envelope, features, fit
from .probes import SHAPES, default_probes, longest_batch

if TYPE_CHECKING:
    from ..timing import TimeCalibration

__all__ = ["Calibration", "ExtrapolationWarning", "Probe", "calibrate", "default_probes"]

#: Format tag of the JSON file :meth:`Calibration.save` writes.
FORMAT = "seqbal.memory.calibration/1"
#: Probes the fit needs before it decides what may run (the first rung has at least four).
FIT_AFTER = 4
#: With ``time=True``: timed calls per probe, the fastest kept.
TIME_REPEATS = 3
#: How far past its largest probe a plan may reach before the calibration warns (tokens).
EXTRAPOLATION_LIMIT = 2.0
#: The most tokens a probe holds (a step that runs them is far past any budget seen so far).
MAX_PROBE_TOKENS = 2 ** 24
#: Growth of the ``long`` probes' peaks below which a step is flat: less than this fraction of
#: the peak over :data:`FLAT_SPAN` times the tokens (a real step holds activations per token).
FLAT_GROWTH, FLAT_SPAN = 0.01, 1024


class ExtrapolationWarning(UserWarning):
    """A plan under this calibration may reach more than 2x the tokens of its largest probe."""


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


@dataclass(frozen=True)
class Calibration:
    """A fitted memory model, a budget, and the token cap and byte cost derived from them.

    Attributes:
        model: the fitted :class:`MemoryModel` (peak bytes of a micro-batch).
        memory_budget: bytes a micro-batch may peak at (on CUDA, absolute, parameters
            included; on the CPU, the bytes the step adds: see :func:`measure_peak`).
        margin: the departure of the true peak from the fitted form that plans tolerate,
            either way (fit error, allocator fragmentation); plans keep predictions within
            ``byte_cap = budget x (1 - margin) / (1 + margin)`` (module docstring).
        length_range: ``(shortest, longest)`` of the user's lengths, or None (any lengths).
        probes: every probe, metered or not, in the order run.
        device: where the probes ran (``"cpu"``, ``"cuda:0"``).
        lengths_total: the tokens of all the user's lengths at once, the longest micro-batch
            they allow (what :meth:`extrapolation` measures plans against), or None.
        timing: with ``calibrate(..., time=True)``, the time model fitted on the same probes
            (:class:`seqbal.timing.TimeCalibration`); None otherwise.

    Examples:
        >>> cal = Calibration(MemoryModel(fixed=1e6, per_token=1e3, per_token_squared=1.0), 10_000_000, margin=0.1)
        >>> cal.byte_cap, cal.max_token_len  # one sequence of 2,226 tokens: 1e6 + 2.226e6 + 4.955e6 bytes
        (8181818, 2226)
        >>> cal.predict([1000, 1000]) <= cal.byte_cap
        True
    """

    model: MemoryModel
    memory_budget: int
    margin: float = 0.1
    length_range: Optional[tuple[int, int]] = None
    probes: tuple[Probe, ...] = field(default=())
    device: str = "cpu"
    lengths_total: Optional[int] = None
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
        if self.lengths_total is not None:
            if isinstance(self.lengths_total, bool) or not isinstance(self.lengths_total, (int, np.integer)) or self.lengths_total < 1:
                raise ValueError(f"lengths_total must be None or a positive int of tokens, got {self.lengths_total!r}")
            object.__setattr__(self, "lengths_total", int(self.lengths_total))

    @property
    def byte_cap(self) -> int:
        """``budget x (1 - margin) / (1 + margin)``: what every planned micro-batch's prediction
        stays under, so that a true peak up to the margin over the fitted form stays within the
        budget even where the fit is up to the margin under it."""
        return _byte_cap(self.memory_budget, self.margin)

    @property
    def max_token_len(self) -> int:
        """The largest token cap whose worst micro-batch (lengths in ``length_range``, or any
        lengths) is predicted within :attr:`byte_cap`.

        Raises:
            ValueError: not even one sequence of the shortest length fits (the budget is
                below the model's fixed bytes), or the model predicts (almost) no growth.
        """
        cap = self.model.max_token_len(self.byte_cap, self.length_range)
        if cap < 1:
            low = 1 if self.length_range is None else self.length_range[0]
            raise ValueError(
                f"not even one sequence of {low} tokens is predicted within {self.byte_cap} bytes (the budget "
                f"{self.memory_budget} with a {self.margin:.0%} margin either way): one is predicted at "
                f"{self.model.predict([low])} bytes, {self.model.fixed:.0f} of them fixed")
        return cap

    def worst_case(self, tokens: Optional[int] = None) -> tuple[int, list[int]]:
        """Predicted bytes and lengths of the worst micro-batch of at most ``tokens`` tokens
        (default :attr:`max_token_len`)."""
        return self.model.worst_case(self.max_token_len if tokens is None else tokens, self.length_range)

    def predict(self, lengths: Sequence[int]) -> int:
        """Predicted peak bytes of one micro-batch of these lengths."""
        return self.model.predict(lengths)

    @property
    def cost_model(self) -> CostModel:
        """A :class:`seqbal.CostModel` of predicted bytes (never below :meth:`predict`): plan
        with ``max_token_len=calibration.byte_cap, cost_model=calibration.cost_model``."""
        return self.model.cost_model()

    def extrapolation(self) -> Optional[dict[str, float]]:
        """How far plans reach past the metered probes; None without one. O(log tokens) after
        the cap.

        Keys: ``largest_probe`` (the most tokens a metered probe held), ``largest_probe_bytes``
        (its peak), ``longest_probe_sequence`` (the longest sequence in a metered probe);
        ``token_cap`` (:attr:`max_token_len`) and ``byte_tokens`` (the most tokens a
        micro-batch planned on :attr:`cost_model` within :attr:`byte_cap` can hold, an upper
        bound), both at most :attr:`lengths_total` when it is known; ``longest_sequence`` (the
        longest sequence either route admits); and ``factor``, the largest of the three over
        what the probes reached. Beyond 2 the calibration warns (:class:`ExtrapolationWarning`)
        and :meth:`explain` says so.
        """
        metered = [p for p in self.probes if p.peak_bytes]
        if not metered:
            return None
        largest = max(metered, key=lambda p: (sum(p.lengths), p.peak_bytes))
        tokens = sum(largest.lengths)
        longest_probed = max(max(p.lengths) for p in metered)
        cap = self.max_token_len
        by_bytes = self.model.max_tokens_by_bytes(self.byte_cap, self.length_range)
        if self.lengths_total is not None:
            cap, by_bytes = min(cap, self.lengths_total), min(by_bytes, self.lengths_total)
        longest = max(min(cap, self.length_range[1]) if self.length_range else cap,
                      _longest_sequence(self.model, self.byte_cap, self.length_range))
        return {"largest_probe": tokens, "largest_probe_bytes": largest.peak_bytes,
                "longest_probe_sequence": longest_probed, "token_cap": cap, "byte_tokens": by_bytes,
                "longest_sequence": longest,
                "factor": max(cap / tokens, by_bytes / tokens, longest / longest_probed)}

    def explain(self) -> str:
        """One paragraph: the cap chosen, the micro-batch that sets it, the largest probe against
        the cap (and a warning past 2x), and the fit's quality."""
        cap = self.max_token_len
        worst, example = self.worst_case()
        spread = "any lengths" if self.length_range is None else (
            f"lengths {self.length_range[0]}..{self.length_range[1]}")
        shape = _describe(example)
        errors = self.probe_errors()
        fit_note = (f"; the fit is within {max(map(abs, errors)):.1%} of its {len(errors)} metered probes"
                    if errors else "")
        failed = sum(1 for p in self.probes if p.peak_bytes is None)
        oom_note = f"; {failed} probe(s) ran out of memory or were skipped" if failed else ""
        reach = self.extrapolation()
        probe_note = "" if reach is None else "; " + _reach_note(reach)
        return (
            f"max_token_len {cap}: the worst micro-batch of {cap} tokens ({spread}) is {shape}, predicted "
            f"{_size(worst)}, within the budget {_size(self.memory_budget)} with a {self.margin:.0%} margin either "
            f"way ({_size(self.byte_cap)}){probe_note}{fit_note}{oom_note}"
        )

    def probe_errors(self) -> list[float]:
        """Relative error of the fit on each metered probe (prediction / peak - 1)."""
        return [self.predict(p.lengths) / p.peak_bytes - 1 for p in self.probes if p.peak_bytes]

    def rebudget(self, memory_budget: Optional[int] = None, *, lengths: Optional[Sequence[int]] = None,
                 margin: Optional[float] = None) -> "Calibration":
        """The same fit under another budget, margin or length distribution. Warns
        (:class:`ExtrapolationWarning`) when its plans reach past 2x the largest probe."""
        moved = Calibration(
            self.model,
            self.memory_budget if memory_budget is None else memory_budget,
            self.margin if margin is None else margin,
            _length_range(lengths) if lengths is not None else self.length_range,
            self.probes,
            self.device,
            _lengths_total(lengths) if lengths is not None else self.lengths_total,
            self.timing,
        )
        _warn_if_extrapolating(moved)
        return moved

    def to_dict(self) -> dict[str, Any]:
        try:
            cap: Optional[int] = self.max_token_len
        except ValueError:
            cap = None
        return {
            "format": FORMAT,
            "device": self.device,
            "memory_budget": self.memory_budget,
            "margin": self.margin,
            "length_range": None if self.length_range is None else list(self.length_range),
            "model": {name: getattr(self.model, name) for name in FEATURES},
            "max_token_len": cap,
            "lengths_total": self.lengths_total,
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
                       probes, str(data.get("device", "")),
                       None if data.get("lengths_total") is None else int(data["lengths_total"]),
                       _timing_from(data.get("timing")))
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


def _byte_cap(memory_budget: int, margin: float) -> int:
    return int(math.floor(memory_budget * (1.0 - margin) / (1.0 + margin)))


def _longest_sequence(model: MemoryModel, byte_cap: int, length_range: Optional[tuple[int, int]]) -> int:
    """The longest sequence a micro-batch predicted within ``byte_cap`` can hold (bisection)."""
    low, high = 1, MAX_CAP_TOKENS if length_range is None else length_range[1]
    if model.predict([low]) > byte_cap:
        return 0
    if model.predict([high]) <= byte_cap:
        return high
    while high - low > 1:  # predict([low]) fits, predict([high]) does not
        middle = (low + high) // 2
        low, high = (middle, high) if model.predict([middle]) <= byte_cap else (low, middle)
    return low


def _reach_note(reach: dict[str, float]) -> str:
    note = (f"the largest probe ran {reach['largest_probe']:,} tokens ({_size(reach['largest_probe_bytes'])}) and the "
            f"longest probed sequence {reach['longest_probe_sequence']:,}; the cap is "
            f"{reach['token_cap'] / reach['largest_probe']:.2f}x those tokens, a micro-batch planned on bytes at most "
            f"{reach['byte_tokens'] / reach['largest_probe']:.2f}x, and a sequence at most "
            f"{reach['longest_sequence'] / reach['longest_probe_sequence']:.2f}x")
    if reach["factor"] > EXTRAPOLATION_LIMIT:
        note += (f": an extrapolation past {EXTRAPOLATION_LIMIT:g}x the probes, where the fit is untested "
                 f"(calibrate again under this budget, with more probes, or on a device with room for them)")
    return note


def _warn_if_extrapolating(calibration: Calibration, stacklevel: int = 3) -> None:
    reach = calibration.extrapolation()
    if reach is not None and reach["factor"] > EXTRAPOLATION_LIMIT:
        warnings.warn(f"seqbal.memory: {_reach_note(reach)}", ExtrapolationWarning, stacklevel=stacklevel)


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


def _lengths_total(lengths: Sequence[int]) -> int:
    array = np.asarray(lengths, dtype=np.int64).ravel()
    return int(array[array > 0].sum())


def _length_range(lengths: Sequence[int]) -> tuple[int, int]:
    array = np.asarray(lengths, dtype=np.int64).ravel()
    if array.size == 0:
        raise ValueError("lengths is empty: pass None for any distribution")
    positive = array[array > 0]
    if positive.size == 0:
        raise ValueError("lengths has no positive length")
    return int(positive.min()), int(positive.max())


class _Prober:
    """Runs probes for :func:`calibrate`: one warm-up call, the meter, out-of-memory errors, the
    record, and the current fit's prediction (refitted only when a probe was added)."""

    def __init__(self, step_fn: Callable[[list[int]], Any], meter: Callable[[Callable[[], Any]], int],
                 oom: tuple[type, ...], clock: Optional[Callable[[list[int], str], Any]] = None) -> None:
        self.step_fn, self.meter, self.oom, self.clock = step_fn, meter, oom, clock
        self.done: list[Probe] = []
        self.timed: list[Any] = []  # with a clock: a TimedProbe per metered probe
        self.warm = False
        self._fit: Optional[tuple[int, np.ndarray]] = None

    @property
    def metered(self) -> list[Probe]:
        return [p for p in self.done if p.peak_bytes is not None]

    def run(self, candidate: list[int], shape: str) -> Probe:
        if not self.warm:  # lazy initialisation (kernels, workspaces) is not the step's
            self.warm = True
            try:
                self.step_fn(list(candidate))
            except self.oom:
                _release_cache()
        try:
            peak = int(self.meter(lambda: self.step_fn(list(candidate))))
        except self.oom as error:
            probe = Probe(tuple(candidate), None, f"out of memory: {type(error).__name__}: {str(error)[:200]}", shape)
            _release_cache()
        else:
            if peak <= 0:
                raise ValueError(
                    f"the meter read {peak} bytes for a micro-batch of {sum(candidate)} tokens ({_describe(candidate)}): "
                    f"it sees nothing the step allocates. Run step_fn on the device metered (device=...; the CPU meter "
                    f"counts torch's CPU allocator only, the CUDA meter the current CUDA device), or pass a meter that "
                    f"returns the step's peak bytes")
            probe = Probe(tuple(candidate), peak, "", shape)
            if self.clock is not None:
                self.timed.append(self.clock(candidate, shape))
        self.done.append(probe)
        return probe

    def predict(self, candidate: list[int]) -> Optional[float]:
        """The current fit's prediction, or None before :data:`FIT_AFTER` metered probes."""
        metered = self.metered
        if len(metered) < FIT_AFTER:
            return None
        if self._fit is None or self._fit[0] != len(metered):
            rows = np.array([features(p.lengths) for p in metered])
            self._fit = (len(metered), fit(rows, np.array([p.peak_bytes for p in metered], dtype=np.float64)))
        return float(features(candidate) @ self._fit[1])


def climb(prober: _Prober, pool: Optional[list[int]], limit: int, start: int, probe_cap: int, most_tokens: int) -> None:
    """Run the probe ladder of the module docstring with ``prober``: at most ``limit`` probes,
    none predicted over ``probe_cap`` bytes or holding more than ``most_tokens`` tokens.

    Raises:
        ValueError: the first probe already peaks over ``probe_cap`` (the budget is below every
            probe), or the ``long`` probes' peaks stay flat over :data:`FLAT_SPAN` x the tokens.
    """
    first = default_probes(max(start // 2, 1), pool)["long"]
    ladder = [(first, "long")] + [(probe, shape) for shape, probe in default_probes(start, pool, seed=1).items()]
    for candidate, shape in ladder:
        if len(prober.done) >= limit:
            break
        probe = prober.run(candidate, shape)
        if probe is prober.done[0] and probe.peak_bytes is not None and probe.peak_bytes > probe_cap:
            raise ValueError(
                f"the budget is below every probe: the smallest, {sum(candidate)} tokens, peaked at {probe.peak_bytes} bytes, "
                f"over the budget with its margin ({probe_cap} bytes). Raise memory_budget (on CUDA it counts the "
                f"parameters, gradients and optimizer state too) or lower start")
    base = prober.done[0]
    scale = {shape: 2 * start for shape in SHAPES}
    stopped = {p.shape for p in prober.done if p.peak_bytes is None or p.peak_bytes > probe_cap}
    active = [shape for shape in SHAPES if shape not in stopped and (shape != "sampled" or pool is not None)]
    below = {shape: start for shape in SHAPES}  # per shape, the largest rung known to fit

    def candidate_at(shape: str, tokens: int) -> Optional[list[int]]:
        return default_probes(tokens, pool, seed=len(prober.done)).get(shape) if tokens <= most_tokens else None

    def fits(shape: str, tokens: int) -> bool:
        candidate = candidate_at(shape, tokens)
        guess = None if not candidate else prober.predict(candidate)
        return guess is not None and guess <= probe_cap

    def ran_within(probe: Probe) -> bool:
        return probe.peak_bytes is not None and probe.peak_bytes <= probe_cap

    def finish(shape: str, good: int, bad: int, tries: int = 3) -> None:
        """The last probes of a shape, between a rung that fits and one that does not: at the
        largest total the fit predicts within, then halfway down after each that does not fit."""
        top = _top_rung(good, bad, lambda t: fits(shape, t))
        while top is not None and tries > 0 and len(prober.done) < limit:
            candidate = candidate_at(shape, top)
            if candidate is None:
                return
            tries -= 1
            if ran_within(prober.run(candidate, shape)):
                return
            top = (good + top) // 2 if (top - good) * 8 >= good else None

    while active and len(prober.done) < limit:
        for shape in list(active):
            if len(prober.done) >= limit:
                break
            # never more than 4x the tokens of the largest probe that ran within the budget
            ceiling = 4 * max(sum(p.lengths) for p in prober.done if ran_within(p))
            tokens = min(scale[shape], ceiling)
            candidate = candidate_at(shape, tokens)
            if candidate is None and tokens < most_tokens and tokens == scale[shape]:
                scale[shape] = min(2 * tokens, most_tokens)  # none of this shape at this rung (a draw too long)
                continue
            guess = None if candidate is None else prober.predict(candidate)
            if guess is None or guess > probe_cap:
                active.remove(shape)
                if guess is not None:
                    finish(shape, below[shape], tokens)
                continue
            far = fits(shape, 8 * tokens)
            step = 4 if far and fits(shape, 16 * tokens) else 2
            clamped = tokens < scale[shape]  # held back by the ceiling: it runs, and the ceiling rises
            # the last rung is the longest micro-batch the lengths allow, when the ladder passes it
            scale[shape] = min(tokens * step, most_tokens) if tokens < most_tokens else tokens * step
            if shape != "long" and far and not clamped:
                below[shape] = tokens
                continue  # not yet near this shape's top: nothing a plan packs lies here
            probe = prober.run(candidate, shape)
            if not ran_within(probe):
                active.remove(shape)
                finish(shape, below[shape], tokens)
                continue
            below[shape] = tokens
            if shape == "long" and base.peak_bytes and tokens >= FLAT_SPAN * sum(base.lengths) and (
                    probe.peak_bytes - base.peak_bytes < FLAT_GROWTH * probe.peak_bytes):
                raise ValueError(
                    f"the metered peaks do not grow with the tokens: {base.peak_bytes} bytes at {sum(base.lengths)} "
                    f"tokens, {probe.peak_bytes} at {tokens}: step_fn must run a micro-batch of the lengths it is "
                    f"given, on the device metered")


def _top_rung(low: int, high: int, fits: Callable[[int], bool]) -> Optional[int]:
    """The largest token total in ``(low, high)`` that ``fits`` (bisection to 1/16 of ``low``),
    or None when none is at least 1/8 above ``low`` (not worth a probe)."""
    step = max(1, low // 16)
    if high - low <= max(1, low // 8) or not fits(low + max(1, low // 8)):
        return None
    good, bad = low + max(1, low // 8), high
    while bad - good > step:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


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
    """Meter ``step_fn`` on probe micro-batches up to the budget's scale, fit peak bytes, and
    derive a cap for the budget.

    Args:
        step_fn: ``step_fn(lengths)`` runs one forward and backward of the user's model on a
            synthetic micro-batch with sequences of these lengths, on the device to calibrate,
            and leaves the state as it found it (gradients set to None, no optimizer step).
        memory_budget: bytes a micro-batch may peak at (see :class:`Calibration`).
        lengths: the user's length distribution (any sequence of ints); the cap is then the
            worst case over micro-batches of lengths within its range, one probe per rung is
            drawn from it, and no probe holds more tokens than all of them. Default None: any
            lengths.
        probes: the most probes to run (default 24), or the exact probe micro-batches (each
            still skipped when predicted over the budget less the margin).
        margin: the departure of the true peak from the fitted form that plans tolerate,
            either way (default 0.1): plans keep predictions within
            ``budget x (1 - margin) / (1 + margin)``; probes run up to ``budget x (1 - margin)``.
        start: token total of the first rung (default 64).
        device: where the meter looks (default: CUDA if available, else the CPU).
        meter: ``meter(step) -> peak bytes``; default :func:`seqbal.memory.measure_peak` on ``device``.
        time: also time every metered probe (the fastest of 3 calls, after its metering: the
            meter's profiler would slow the step it times) and fit the time model on them, as
            :func:`seqbal.timing.calibrate` does; the result is ``.timing``. Default False.
        timer: with ``time``, ``timer(step) -> seconds``; default :func:`seqbal.timing.time_step`
            on ``device`` (CUDA events, or the thread's CPU time).

    Returns:
        A :class:`Calibration`; ``.max_token_len``, ``.predict(lengths)``, ``.cost_model``,
        ``.timing`` with ``time=True``.

    Warns:
        ExtrapolationWarning: a plan under the result may reach more than 2x the tokens of the
            largest probe (probes were cut short by ``probes``, out-of-memory errors or
            ``lengths``).

    Raises:
        ValueError: bad arguments; the meter reads nothing (a peak of 0 bytes); the budget is
            below every probe; the peaks do not grow with the tokens (a flat fit); fewer than
            two probes could be metered; no sequence fits the budget.

    Complexity: at most ``probes`` runs of ``step_fn`` (each metered), plus O(64 * P) per fit.
    """
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)) or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive int of bytes, got {memory_budget!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise ValueError(f"start must be a positive int of tokens, got {start!r}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"margin must be a fraction in [0, 1), got {margin!r}")
    length_range = None if lengths is None else _length_range(lengths)
    pool = None if lengths is None else [int(s) for s in np.asarray(lengths).ravel() if s > 0]
    if meter is None:
        from .meter import measure_peak

        def meter(step: Callable[[], Any]) -> int:
            return measure_peak(step, device)
    from .meter import _oom_types

    probe_cap = int(math.floor(int(memory_budget) * (1.0 - margin)))  # what a probe may be predicted at
    clock = None
    if time:
        from ..timing.calibration import timed_probe

        def clock(candidate: list[int], shape: str) -> Any:
            return timed_probe(step_fn, candidate, shape, device=device, timer=timer, repeats=TIME_REPEATS)
    prober = _Prober(step_fn, meter, _oom_types(), clock)
    if isinstance(probes, int) and not isinstance(probes, bool):
        if probes < 2:
            raise ValueError(f"probes must be at least 2, got {probes}")
        climb(prober, pool, probes, start, probe_cap, longest_batch(pool, MAX_PROBE_TOKENS))
    else:
        for candidate in ([int(s) for s in probe] for probe in probes):
            guess = prober.predict(candidate)
            if guess is not None and guess > probe_cap:
                prober.done.append(Probe(tuple(candidate), None,
                                         f"skipped: predicted {guess:.0f} bytes > budget less margin {probe_cap}", "given"))
                continue
            prober.run(candidate, "given")
    done, metered = prober.done, prober.metered
    if metered and min(p.peak_bytes for p in metered) > probe_cap:
        smallest = min(metered, key=lambda p: p.peak_bytes)
        raise ValueError(
            f"the budget is below every probe: the smallest peak, {smallest.peak_bytes} bytes for {sum(smallest.lengths)} "
            f"tokens, is over the budget with its margin ({probe_cap} bytes): raise memory_budget or probe smaller")
    if len(metered) < 2:
        raise ValueError(
            f"calibration metered {len(metered)} probe(s) under the budget less margin, {probe_cap} bytes (of {len(done)} tried: "
            + "; ".join(f"{list(p.lengths)[:4]}: {p.error or p.peak_bytes}" for p in done[:4])
            + "): raise memory_budget or lower start"
        )
    rows = np.array([features(p.lengths) for p in metered])
    peaks = np.array([p.peak_bytes for p in metered], dtype=np.float64)
    coefficients = fit(rows, peaks)
    coefficients = coefficients * envelope(rows, peaks, coefficients)
    if not (coefficients[1:] > 0).any():
        raise ValueError(
            f"the fit has no growth term: {len(metered)} probes from {min(sum(p.lengths) for p in metered)} to "
            f"{max(sum(p.lengths) for p in metered)} tokens peaked at {peaks.min():.0f}..{peaks.max():.0f} bytes, "
            f"no more for more tokens: step_fn must run a micro-batch of the lengths it is given, on the device metered")
    timing = None
    if time:
        from ..timing.calibration import fit_probes, timing_fields

        timing = fit_probes(prober.timed, **timing_fields(device, timer, TIME_REPEATS, 1))
    calibration = Calibration(MemoryModel.from_coefficients(coefficients), int(memory_budget), margin, length_range,
                              tuple(done), _device_name(device), None if pool is None else sum(pool), timing)
    calibration.max_token_len  # noqa: B018 - raises ValueError when no cap exists (module docstring)
    _warn_if_extrapolating(calibration)
    return calibration


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
