"""Balance the clock: fit seconds of a micro-batch on its lengths, from the user's own step.

A FLOPs formula is a proxy for the time a step waits for. :func:`calibrate` times a few probe
micro-batches of the user's own step (:mod:`.clock`: CUDA events, or the thread's CPU time),
fits ``seconds = fixed + per_sequence * n + per_token * sum(s) + per_token_squared * sum(s**2)``
(:mod:`.model`) and returns a :class:`TimeCalibration` whose ``workload_fn`` is what every
planner balances. :class:`Recorder` fits the same model from the micro-batches a training run
times anyway, pooled over the data-parallel ranks in one collective.

The model and the fit are pure NumPy (and Python floats); only the clock imports torch.
"""

from __future__ import annotations

from .calibration import MAX_PROBES, TimeCalibration, TimedProbe, calibrate, fit_probes
from .clock import time_step
from .model import FEATURES, TimeModel, features, fit
from .recorder import Recorder
from .schedule import fastest_schedule, predicted_step_seconds

__all__ = [
    "Recorder", "TimeCalibration", "TimeModel", "TimedProbe", "calibrate", "fastest_schedule", "fit_probes",
    "predicted_step_seconds", "time_step",
    "FEATURES", "MAX_PROBES", "features", "fit",
]
