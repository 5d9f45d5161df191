"""Pipeline order and :func:`dummy_source`: what a plan's caller does with the parts.

:func:`order_for_pipeline` orders micro-batches for pipelined execution (the order of
``use_dynamic_bsz_balance``); :func:`dummy_source` names the sample whose copies fill the empty
micro-batches of ``dummy_micro_batches=True``. Pure NumPy, no agreement.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from ..cost import CostModel, as_cost_model
from ..partition.bins import _sums
from ..partition.parts import _part_sums
from ..validation import int_argument
from .arguments import _lengths_array
from .errors import LengthsLike, MicroBatchPlanError


def dummy_source(lengths: LengthsLike, force_group_size: int = 1, cost_model: Union[None, str, CostModel] = None) -> list[int]:
    """The samples a dummy micro-batch copies: the rank's cheapest forced group.

    With ``force_group_size=1`` that is the shortest sample (the first on ties): one sample,
    which costs at most the cap under every cost model because every sample was checked
    against it. With ``force_group_size=g > 1`` the planner's unit is a group, so a dummy is
    a copy of the group that costs least under ``cost_model`` (``g`` samples): it keeps the
    shape a group-wise loss expects (``g`` rows of one group), and it costs at most the cap
    because every group was checked against it. Ties: fewer raw tokens, then the first group.
    O(n log n).

    Raises:
        MicroBatchPlanError: no samples (there is nothing to copy).

    Examples:
        >>> dummy_source([5, 2, 7, 2])
        [1]
        >>> dummy_source([5, 2, 7, 1], force_group_size=2)  # groups cost 7 and 8 tokens
        [0, 1]
    """
    array = _lengths_array(lengths)
    try:
        g = int_argument("force_group_size", force_group_size, expected="an int >= 1")
    except ValueError as error:
        raise MicroBatchPlanError(str(error), MicroBatchPlanError.BAD_ARGUMENT) from None
    if len(array) % g:
        raise MicroBatchPlanError(
            f"force_group_size={force_group_size} does not divide the batch size {len(array)}", MicroBatchPlanError.BAD_BATCH
        )
    costs = as_cost_model(cost_model).group_costs(array, g)
    # least cost, then fewest raw tokens (rounding makes costs tie), then the first group
    cheapest = int(np.lexsort((np.arange(len(costs)), array.reshape(-1, g).sum(axis=1), costs))[0])
    return list(range(cheapest * g, cheapest * g + g))


def order_for_pipeline(parts: list[list[int]], workloads: np.ndarray) -> list[list[int]]:
    """Order micro-batches heaviest in the middle, lightest at both ends.

    Sorts by (workload, first index) descending, then takes ``parts[::2][::-1] + parts[1::2]``:
    light micro-batches at the ends shorten pipeline warm-up and cool-down bubbles. O(k log k).
    """
    values = np.asarray(workloads)
    if values.dtype.kind in "iu":  # int64 sums as .sum() would form them, small ones in the interpreter
        return _pipeline_order(parts, _sums(values.astype(np.int64), parts))
    return _pipeline_order(parts, _part_sums(values, parts).tolist())  # one NumPy pass


def _pipeline_order(parts: list[list[int]], totals: Sequence[int]) -> list[list[int]]:
    """:func:`order_for_pipeline` given each micro-batch's total workload."""
    ranked = sorted(range(len(parts)), key=lambda i: (totals[i], parts[i][0] if parts[i] else 0), reverse=True)
    ordered = [parts[i] for i in ranked]
    return ordered[::2][::-1] + ordered[1::2]
