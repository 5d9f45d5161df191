"""Costs from measurement: meters that run the user's own training step on probe micro-batches
and fit what a plan caps (peak bytes, :mod:`.memory`) from what was measured.

A formula (tokens, FLOPs) is a proxy for what the user pays; a calibration measures it on the
user's own model and hardware, at the scale of the budget it will plan under. Each meter lives
in a subpackage of its own; the public entry points are :mod:`seqbal.memory`.
"""
