"""Balance the clock: fit a micro-batch's seconds from the user's own step, or from the run.

The public entry point of the timing calibration, which lives in :mod:`seqbal.calibration.timing`
beside the memory calibration. ``from seqbal.timing import calibrate, Recorder`` is the
documented import (docs/timing.md)::

    cal = calibrate(step, lengths=my_lengths, max_token_len=8192)   # about 24 probes
    schedule = build_dp_schedule(lengths, dp, 8192, workload_fn=cal.workload_fn)
"""

from __future__ import annotations

from .calibration.timing import (
    FEATURES,
    MAX_PROBES,
    Recorder,
    TimeCalibration,
    TimedProbe,
    TimeModel,
    calibrate,
    fastest_schedule,
    predicted_step_seconds,
    features,
    fit,
    fit_probes,
    time_step,
)

__all__ = [
    "Recorder", "TimeCalibration", "TimeModel", "TimedProbe", "calibrate", "fastest_schedule", "fit_probes",
    "predicted_step_seconds", "time_step",
    "FEATURES", "MAX_PROBES", "features", "fit",
]
