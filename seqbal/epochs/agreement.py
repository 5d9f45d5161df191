"""Proof that every rank plans from the same inputs, for planners that run on every rank with no
collective of their own (the token-budget sampler, ``pack_rows``).

Such a planner is correct only if every rank hands it the same global lengths and settings: it
then computes the very same plan everywhere and each rank takes its own share. If one rank's
preprocessing differs by a single token (a non-deterministic tokenizer or filter, a stale
dataset cache), the plans become unrelated: some samples are trained by no rank and others by
two, with the same ``len()`` everywhere, so nothing warns; a larger difference changes
``len()``, and the rank with one micro-batch more waits in its gradient all-reduce until the
process group times out.

So the planner calls :func:`check_same_inputs` once, before it plans. Each rank sends its
settings and a 63-bit BLAKE2b digest of its lengths in one MAX all-reduce (each value with its
negation, so every rank learns the minimum and the maximum: about ``2 x (settings + 2)`` int64s),
together with an error flag: a rank whose own arguments were invalid joins the collective
instead of raising, so no rank is left waiting in it, and every rank then raises. Only when the
lengths differ (and their counts agree) does a second all-reduce of the lengths themselves find
the first sample on which the ranks disagree; that path ends in an error anyway.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["digest", "should_check", "check_same_inputs", "agree_or_raise"]

_MASK = (1 << 63) - 1


def digest(value: Any) -> int:
    """A 63-bit digest (non-negative int64) of an int array's values, or of ``repr`` of anything
    else (a cost model, a seed too large for int64). O(n)."""
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value, dtype="<i8").tobytes()
    else:
        data = repr(value).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & _MASK


def should_check(num_replicas: int, process_group: Any) -> bool:
    """True where torch.distributed is initialised and the plan is shared by more than one rank
    (``num_replicas > 1``) of a group of more than one process. Imports torch only when it is
    already loaded: a process that never imported torch has no process group."""
    import sys

    if num_replicas <= 1 or "torch" not in sys.modules:
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    return dist.get_world_size(process_group) > 1


def check_same_inputs(
    settings: Sequence[tuple[str, Optional[int]]],
    lengths: Optional[np.ndarray],
    local_error: Optional[BaseException],
    process_group: Any,
    *,
    who: str,
) -> None:
    """Agree with the other ranks of ``process_group`` (None: the default group) that they all
    hold the same ``settings`` and ``lengths``, and that none found an error; raise the same
    ``ValueError`` on every rank otherwise.

    Args:
        settings: ``(argument name, value)`` pairs, values ints in ``[0, 2**63)`` (digest
            anything else first) or None where this rank has no valid value.
        lengths: this rank's lengths (None if they were invalid here).
        local_error: the error this rank found in its own arguments, if any: raised here, after
            the collective, so that the other ranks raise too instead of waiting.
        who: the planner, for the messages (``"TokenBudgetBatchSampler"``).

    Raises:
        ValueError: this rank's own ``local_error``; another rank's error (naming that rank);
            settings or lengths that differ between ranks (naming what differs and how to fix
            it).

    Cost: one all-reduce of ``2 x (len(settings) + 3)`` int64s; a second one of ``2n`` int64s
    only when the lengths differ.
    """
    from .. import collectives

    values = [value for _, value in settings]
    count = None if lengths is None else int(len(lengths))
    lengths_digest = None if lengths is None else digest(lengths)
    agreement = collectives.agree_on_constraints(
        0, 0, 0, 1 if local_error is not None else 0, process_group, must_match=[*values, count, lengths_digest]
    )
    if local_error is not None:
        raise local_error
    if agreement.error_code:
        raise ValueError(
            f"{who}: rank {agreement.error_rank} of the process group failed to build it (see that rank's error "
            f"for the argument and the numbers); this rank's own arguments were valid"
        )
    *setting_ranges, count_range, digest_range = agreement.must_match_ranges
    differing = [
        f"{name} (from {low} to {high} over the ranks; {value} here)"
        for (name, value), (low, high) in zip(settings, setting_ranges)
        if low != high
    ]
    if differing:
        raise ValueError(
            f"{who}: the ranks passed different settings, so they would plan different epochs (samples skipped "
            f"or trained twice, or a rank left waiting in a collective): {'; '.join(differing)}. Pass the same "
            f"{', '.join(name for name, _ in settings)} on every rank"
        )
    if count_range[0] != count_range[1]:
        raise ValueError(
            f"{who}: the ranks hold different datasets: from {count_range[0]} to {count_range[1]} samples over "
            f"the ranks ({count} here). Every rank must pass the lengths of the whole dataset, the same list: "
            f"build it from one preprocessed copy (a dataset cache shared by the ranks, or preprocessing on one "
            f"rank first), not from each rank's own tokenization or filtering"
        )
    if digest_range[0] != digest_range[1]:
        low, high = collectives.min_and_max(lengths, process_group)
        first = int(np.flatnonzero(low != high)[0])
        differ = int(np.count_nonzero(low != high))
        raise ValueError(
            f"{who}: the ranks hold different lengths for the same {count} samples: they first differ at sample "
            f"{first} (from {int(low[first])} to {int(high[first])} tokens over the ranks; {int(lengths[first])} "
            f"here), and {differ} sample(s) differ in all. Every rank must pass the lengths of the whole dataset, "
            f"the same list: build it from one preprocessed copy (a dataset cache shared by the ranks, or "
            f"preprocessing on one rank first), not from each rank's own tokenization or filtering"
        )


def agree_or_raise(
    settings: Sequence[tuple[str, Optional[int]]],
    lengths: Optional[np.ndarray],
    local_error: Optional[BaseException],
    num_replicas: Any,
    process_group: Any,
    *,
    who: str,
) -> None:
    """What a planner calls once its local checks ran: :func:`check_same_inputs` where
    :func:`should_check` says the ranks share the plan, else raise ``local_error`` if there is
    one. A ``num_replicas`` that was itself invalid counts as shared, so that the rank that
    passed it still joins the collective its peers are in."""
    valid = isinstance(num_replicas, (int, np.integer)) and not isinstance(num_replicas, bool) and num_replicas > 0
    if should_check(int(num_replicas) if valid else 2, process_group):
        check_same_inputs(settings, lengths, local_error, process_group, who=who)
    elif local_error is not None:
        raise local_error
