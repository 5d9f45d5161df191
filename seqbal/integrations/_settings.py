"""What an adapter's ``install()`` passes on to every plan it makes: the workload model and the
micro-batch order.

A trainer calls seqbal's planners from its own code, with its own arguments; the planning
choices that trainer has no word for (``workload_fn``, ``micro_batch_order``) are given once to
``install()`` and held here until ``uninstall()``. They are checked when given (a bad model is
an error at install, not at the first step), and every planner still checks them, and compares
them across ranks, as for any other argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..order import check_micro_batch_order
from ..workload import WorkloadFn, workload_digest


@dataclass(frozen=True)
class PlanSettings:
    """The ``workload_fn`` and ``micro_batch_order`` an adapter forwards (see the module docstring).

    >>> PlanSettings.checked(None, "largest_first").keywords()
    {'workload_fn': None, 'micro_batch_order': 'largest_first'}
    """

    workload_fn: Optional[WorkloadFn] = None
    #: None only where the adapter's planner has an order of its own to keep (the token-budget
    #: sampler's random slot order, AReaL's index order): ``checked(..., order_optional=True)``.
    micro_batch_order: Optional[str] = "pipeline"

    @classmethod
    def checked(cls, workload_fn: Any, micro_batch_order: Any, *, order_optional: bool = False) -> "PlanSettings":
        """The settings, or a ``ValueError``: ``workload_fn`` not None or a callable, or failing on
        the probe lengths (:func:`seqbal.workload.workload_digest`); an unknown order (None is
        one only with ``order_optional``)."""
        if workload_fn is not None and not callable(workload_fn):
            raise ValueError(f"workload_fn must be None or a callable (lengths -> workloads), got {workload_fn!r:.80}")
        workload_digest(workload_fn)
        if micro_batch_order is None and order_optional:
            return cls(workload_fn, None)
        return cls(workload_fn, check_micro_batch_order(micro_batch_order))

    def keywords(self, order: bool = True) -> dict[str, Any]:
        """The keyword arguments for a planner (without ``micro_batch_order`` for one that does
        not order micro-batches)."""
        if not order:
            return {"workload_fn": self.workload_fn}
        return {"workload_fn": self.workload_fn, "micro_batch_order": self.micro_batch_order}

    def merged(self, kwargs: dict[str, Any], order: bool = True) -> dict[str, Any]:
        """``kwargs`` with these settings where the caller passed none of its own."""
        return {**self.keywords(order), **kwargs}
