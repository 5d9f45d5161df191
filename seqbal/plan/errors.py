"""The plan's error type and the tables the data-parallel agreement reads.

:class:`MicroBatchPlanError` (a ``ValueError``) carries a ``code`` that orders the kinds of
failure: the agreement reduces the codes with a max, so the largest one found on any rank is the
one every rank reports. ``_REASONS`` words each code for the ranks that did not find it;
``_MUST_MATCH`` lists the arguments every rank must pass identically. Kept apart from the
planning so that the adapters and the loss can import them without the planner.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np


#: Effective lengths: a sequence of ints, a NumPy integer array or a 1-D integer torch tensor.
LengthsLike = Union[Sequence[int], np.ndarray, Any]


class MicroBatchPlanError(ValueError):
    """A micro-batch plan cannot be made; the message says which input and what numbers.

    ``code`` orders the kinds of failure for the data-parallel agreement (the largest code
    found on any rank is the one every rank reports).
    """

    CANNOT_SATISFY = 1
    FORCED_GROUP_EXCEEDS = 2
    SAMPLE_EXCEEDS = 3
    NEGATIVE_LENGTH = 4
    EMPTY_BATCH = 5
    BAD_BATCH = 6
    BAD_ARGUMENT = 7
    #: Found only by the agreement (never sent by one rank): the ranks passed different values
    #: of an argument that must be identical on every rank of ``dp_group``.
    MISMATCHED_ARGUMENTS = 8
    #: A forced group holds more samples than ``max_samples_per_micro_batch`` allows (sent by a
    #: rank like the codes below 8; numbered after them so that the older codes keep their values).
    GROUP_EXCEEDS_SAMPLES = 9

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[Any, tuple[str, int]]:
        # BaseException pickles ``self.args`` (the message alone) and would call
        # ``cls(message)`` on load, which lacks ``code``: pickle and deepcopy (Ray and
        # ProcessPoolExecutor workers) need both arguments back.
        return (type(self), (str(self), self.code))


# Named by the package that exports it, as before the split: tracebacks keep printing
# ``seqbal.plan.MicroBatchPlanError`` (doctests and logs match on it) and pickles keep the path.
MicroBatchPlanError.__module__ = "seqbal.plan"


_REASONS = {
    MicroBatchPlanError.CANNOT_SATISFY: "it cannot form the number of micro-batches needed",
    MicroBatchPlanError.FORCED_GROUP_EXCEEDS: "a forced group exceeds max_token_len",
    MicroBatchPlanError.SAMPLE_EXCEEDS: "a sample exceeds max_token_len",
    MicroBatchPlanError.NEGATIVE_LENGTH: "a sequence length is negative",
    MicroBatchPlanError.EMPTY_BATCH: "its batch is empty",
    MicroBatchPlanError.BAD_BATCH: "its batch is malformed",
    MicroBatchPlanError.BAD_ARGUMENT: "an argument is invalid",
    MicroBatchPlanError.MISMATCHED_ARGUMENTS: "the ranks passed different arguments",
    MicroBatchPlanError.GROUP_EXCEEDS_SAMPLES: "a forced group exceeds max_samples_per_micro_batch",
}

#: Arguments that must be identical on every rank of ``dp_group``: a different cap or group size
#: would silently plan each rank under its own rules, a different divisor gives different counts
#: (a hang in the training step); a different sample cap (``None`` counts as 0) would plan
#: each rank under its own rules too; a different ``workload_fn`` (compared by a digest of its
#: workloads on fixed probe lengths) would balance each rank on its own model, and a different
#: ``micro_batch_order`` would run slot ``i`` out of step. ``min_num_micro_batch`` may differ: the agreed count is the
#: largest proposal, so it honours the largest minimum on every rank.
_MUST_MATCH = (
    "max_token_len",
    "num_batches_divided_by",
    "force_group_size",
    "cost_model.padded",
    "cost_model.round_to",
    "cost_model.pack_round_to",
    "dummy_micro_batches",
    "max_samples_per_micro_batch",
    "cost_model.memory.fixed",
    "cost_model.memory.per_sequence",
    "cost_model.memory.per_token",
    "cost_model.memory.per_token_squared",
    "workload_fn",
    "micro_batch_order",
)
