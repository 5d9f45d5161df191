"""Plan against memory: calibrate a token cap, or a byte cost, from the user's own model.

The public entry point of the memory calibration, which lives in :mod:`seqbal.calibration.memory`
beside the other costs from measurement. ``from seqbal.memory import calibrate`` is the documented
import (docs/memory.md).
"""

from __future__ import annotations

from .calibration.memory import (
    FEATURES,
    Calibration,
    ExtrapolationWarning,
    MemoryModel,
    Probe,
    calibrate,
    default_probes,
    features,
    fit,
    measure_peak,
)

__all__ = [
    "Calibration", "ExtrapolationWarning", "Probe", "calibrate", "default_probes", "measure_peak", "FEATURES", "MemoryModel", "features", "fit",
]
