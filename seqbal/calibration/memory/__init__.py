"""Plan against memory: calibrate a token cap, or a byte cost, from the user's own model.

``max_token_len`` is a proxy for memory. :func:`calibrate` meters a few probe micro-batches
of the user's own training step (:func:`measure_peak`), fits peak bytes as a function of the
lengths (:class:`MemoryModel`), and returns a :class:`Calibration`: the largest token cap
whose worst micro-batch stays within a memory budget, a prediction, and a
:class:`seqbal.CostModel` that caps predicted bytes directly.

The probe shapes (:mod:`.probes`), the fitting (:mod:`.model`) and the budget logic
(:mod:`.calibration`) are pure NumPy; only
metering (:mod:`.meter`) and running probes import torch, when used.
"""

from __future__ import annotations

from .calibration import Calibration, ExtrapolationWarning, Probe, calibrate, default_probes
from .meter import measure_peak
from .model import FEATURES, MemoryModel, features, fit

__all__ = [
    "Calibration", "ExtrapolationWarning", "Probe", "calibrate", "default_probes", "measure_peak", "FEATURES", "MemoryModel", "features", "fit",
]
