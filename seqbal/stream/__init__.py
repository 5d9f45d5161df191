"""Steps over time: :class:`StepPlanner` (:mod:`.planner`) and its pure pieces: the pending pool,
the choice of a step's groups, and the layout of a step over ranks and micro-batch slots.

A step planner decides *which* samples of a pool that fills over time go into the next training
step, and then how they form micro-batches on every data-parallel rank. Each concern is a
module of its own, on plain NumPy arrays, with no collective:

* :mod:`.planner`: :class:`StepPlanner`, which composes the pieces below (and the one collective
  of a ``dp_group``, through :mod:`seqbal.collectives`).
* :mod:`.pool`: the pending groups in arrival order (validation of arrivals, admission).
* :mod:`.fill`: filling a fixed number of capped micro-batches from the pool, oldest first.
* :mod:`.exact`: choosing exactly ``S`` samples of whole groups, oldest first.
* :mod:`.layout`: laying a step's micro-batches out as ``[rank][slot]``, slot-balanced, with
  empty (dummy) micro-batches where a flush has too few groups.
"""

from __future__ import annotations

from .exact import exact_selection
from .fill import fill_bins
from .layout import layout_bins
from .pool import Pool
from .planner import StepPlanner

__all__ = ["StepPlanner", "Pool", "fill_bins", "exact_selection", "layout_bins"]
