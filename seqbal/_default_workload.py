"""The default workload model's constants, in a module that imports nothing of seqbal.

Both :mod:`seqbal.validation` (whose int64 guard computes the default model's exact total before
the model itself could wrap around) and :mod:`seqbal.workload` (the model) need them; kept in a
leaf module so that validation does not import workload, which imports validation for its own
checks. :mod:`seqbal.workload` re-exports both names.
"""

from __future__ import annotations

#: Hidden size the default workload model is calibrated for (7B-class dense transformers).
DEFAULT_HIDDEN_SIZE = 4096
#: Linear coefficient of the default model: ``6 * DEFAULT_HIDDEN_SIZE``.
DEFAULT_LINEAR_COEFFICIENT = 6 * DEFAULT_HIDDEN_SIZE  # 24576
