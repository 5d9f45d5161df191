"""plan_micro_batches and plan_data_parallel: the decision on plain lengths, and the agreement.

This package composes the pure partitioner (``seqbal.partition``) with the data-parallel
agreement (``collectives.py``). It needs only NumPy: torch (through ``collectives``) is
imported only in sync mode, when the caller already holds a process group, so planning on a
driver, in the CLI or in a trainer that is not built on torch costs no torch import.
:func:`seqbal.rearrange.rearrange_micro_batches` adds reading the lengths from a TensorDict
and copying each micro-batch out of it.

Errors are detected locally first and raised as :class:`MicroBatchPlanError` (a
``ValueError``). In sync mode a rank that found one does *not* raise at once: it joins the
first all-reduce with an error code, so that every rank learns of the failure and raises
together; raising first would leave the healthy ranks blocked in a collective until the
process-group timeout.

With ``dummy_micro_batches=True`` in sync mode, a rank with fewer groups than the agreed count
is not an error: it proposes the count it needs like any rank, partitions its groups one per
part, and returns empty index lists for the rest (the caller fills them with copies of a
sample, see :func:`dummy_source`). The flag is one of the arguments every rank must match: a
rank that raised ``Cannot satisfy`` while its peers went on to the second all-reduce would hang.

The package is split by concern, in import order (each module imports only those above it):

* :mod:`.errors`: :class:`MicroBatchPlanError`, its reasons, the arguments that must match.
* :mod:`.arguments`: reading and checking the plan's arguments, before any collective.
* :mod:`.pipeline`: :func:`order_for_pipeline` and :func:`dummy_source`.
* :mod:`.local`: the local decision of one rank (its plan, its proposal, its parts).
* :mod:`.agreement`: :func:`_plan`, the sync mode, and the errors found on peers.
* :mod:`.entry`: the public entry points :func:`plan_micro_batches`, :func:`plan_data_parallel`.
"""

from __future__ import annotations

from .agreement import _check_dp_group, _plan, _rank_name
from .arguments import _as_flag
from .entry import plan_data_parallel, plan_micro_batches
from .errors import _REASONS, LengthsLike, MicroBatchPlanError
from .local import _local_plan, _LocalPlan, _WindowedLengths
from .pipeline import dummy_source, order_for_pipeline

__all__ = [
    "MicroBatchPlanError",
    "LengthsLike",
    "plan_micro_batches",
    "plan_data_parallel",
    "order_for_pipeline",
    "dummy_source",
]
