"""Proof that every rank plans from the same inputs, for planners that run on every rank with no
collective of their own (the token-budget sampler, ``pack_rows``).

Such a planner is correct only if every rank hands it the same global lengths and settings: it
then computes the very same plan everywhere and each rank takes its own share. If one rank's
preprocessing differs by a single token (a non-deterministic tokenizer or filter, a stale
dataset cache), the plans become unrelated: some samples are trained by no rank and others by
two, with the same ``len()`` everywhere, so nothing warns; a larger difference changes
``len()``, and the rank with one micro-batch more waits in its gradient all-reduce until the
process group times out.

So the planner calls :func:`agree_or_raise` once, before it plans. Each rank sends its
settings and a 63-bit BLAKE2b digest of its lengths in one MAX all-reduce (each value with its
negation, so every rank learns the minimum and the maximum: about ``2 x (settings + 2)`` int64s),
together with an error flag: a rank whose own arguments were invalid joins the collective
instead of raising, so no rank is left waiting in it, and every rank then raises. Only when the
lengths differ (and their counts agree) does a second all-reduce of the lengths themselves find
the first sample on which the ranks disagree; that path ends in an error anyway.

Who the ranks are is part of what they must agree on. The check runs wherever the process group
has more than one rank, whatever ``num_replicas`` says (a rank that believed it was alone and
skipped the collective would leave its peers in it until the timeout), ``num_replicas`` must be
the group's size, and every rank's ``rank`` travels in the same all-reduce in a slot of its own
(``world`` more int64s), so that two ranks claiming one share, which would train it twice and
another never, are seen alike on every rank. The verdict is :func:`input_disagreement`, a pure
function of what the all-reduce returned, so every rank reaches the same one.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["digest", "group_size", "should_check", "input_disagreement", "agree_or_raise"]

_MASK = (1 << 63) - 1


def digest(value: Any) -> int:
    """A 63-bit digest (non-negative int64) of an int array's values, or of ``repr`` of anything
    else (a cost model, a seed too large for int64). O(n)."""
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value, dtype="<i8").tobytes()
    else:
        data = repr(value).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & _MASK


def group_size(process_group: Any) -> int:
    """The number of ranks of ``process_group`` (None: the default group) where torch.distributed
    is initialised, else 1. Imports torch only when it is already loaded: a process that never
    imported torch has no process group."""
    import sys

    if "torch" not in sys.modules:
        return 1
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group)


def should_check(process_group: Any) -> bool:
    """True where torch.distributed is initialised and ``process_group`` has more than one rank:
    whatever the planner's own arguments say (a rank that passed ``num_replicas=1`` must still
    join the check its peers are in, or they wait in it until the timeout)."""
    return group_size(process_group) > 1


def input_disagreement(
    settings: Sequence[tuple[str, Optional[int]]],
    setting_ranges: Sequence[Optional[tuple[int, int]]],
    world: int,
    num_replicas: Optional[int] = None,
    ranks: Optional[Sequence[Optional[int]]] = None,
    *,
    who: str,
) -> Optional[str]:
    """What the ranks disagree on, decided from facts every rank holds alike after the all-reduce
    (so every rank reaches the same verdict), or None when they agree. Pure: no collective.

    Args:
        settings: this rank's ``(name, value)`` pairs (the values only appear as "here").
        setting_ranges: ``(min, max)`` of each setting over the ranks.
        world: the process group's size.
        num_replicas: the replicas this rank plans for (also one of ``settings``), or None
            where the planner has no such argument.
        ranks: every rank's claimed position among the replicas, in group order (None: the
            planner has no rank argument).
        who: the planner, for the messages.

    Checked in this order: a setting that differs between ranks (naming each, with its range);
    a ``num_replicas`` that is not the group's size; a position claimed by two ranks (naming
    both, and a position claimed by none). O(settings + world).

    >>> input_disagreement([("seed", 3)], [(3, 3)], 2, 2, [0, 0], who="sampler")[:53]
    'sampler: ranks 0 and 1 of the process group both pass'
    """
    differing = [
        f"{name} (from {low} to {high} over the ranks; {value} here)"
        for (name, value), span in zip(settings, setting_ranges)
        if span is not None for low, high in [span] if low != high
    ]
    if differing:
        return (
            f"{who}: the ranks passed different settings, so they would plan different epochs (samples skipped "
            f"or trained twice, or a rank left waiting in a collective): {'; '.join(differing)}. Pass the same "
            f"{', '.join(name for name, _ in settings)} on every rank"
        )
    if num_replicas is not None and num_replicas != world:
        return (
            f"{who}: num_replicas={num_replicas} on every rank, but its process group has {world} ranks: each "
            f"rank would plan for {num_replicas} replica(s) while {world} take part (samples trained by several "
            f"ranks, or never). Pass num_replicas={world}, or, where the data is split over fewer ranks than the "
            f"group holds (tensor or pipeline parallelism), process_group= the data-parallel group of this rank"
        )
    if ranks is not None and None not in ranks:
        first: dict[int, int] = {}
        for position, claimed in enumerate(ranks):
            if claimed in first:
                missing = sorted(set(range(len(ranks))) - set(ranks))
                unclaimed = f"; rank={missing[0]} is passed by none" if missing else ""
                return (
                    f"{who}: ranks {first[claimed]} and {position} of the process group both pass rank={claimed}"
                    f"{unclaimed}, so one share of every epoch would be trained twice and another never. Pass "
                    f"each rank its own rank (its rank in the process group, by default)"
                )
            first[claimed] = position
    return None


def agree_or_raise(
    settings: Sequence[tuple[str, Optional[int]]],
    lengths: Optional[np.ndarray],
    local_error: Optional[BaseException],
    process_group: Any,
    *,
    who: str,
    num_replicas: Optional[int] = None,
    rank: Optional[int] = None,
    ranked: bool = False,
) -> None:
    """What a planner calls once its local checks ran, on every rank. Where the group has one
    rank (:func:`should_check`), raise ``local_error`` if there is one. Else, whatever
    ``num_replicas`` says, agree with the other ranks of ``process_group`` (None: the default
    group) that they all hold the same ``settings`` and ``lengths``, that none found an error,
    that ``num_replicas`` is the group's size and that every rank holds its own ``rank``; raise
    the same ``ValueError`` on every rank otherwise.

    Args:
        settings: ``(argument name, value)`` pairs, values ints in ``[0, 2**63)`` (digest
            anything else first) or None where this rank has no valid value. Every rank must
            pass the same names, in the same order.
        lengths: this rank's lengths (None if they were invalid here).
        local_error: the error this rank found in its own arguments, if any: raised here, after
            the collective, so that the other ranks raise too instead of waiting.
        who: the planner, for the messages (``"TokenBudgetBatchSampler"``).
        num_replicas: the replicas this rank plans for (None: invalid here, or the planner has
            none); must equal the group's size.
        rank: this rank's position among the replicas (None: invalid here); with ``ranked``,
            every rank's must differ.
        ranked: the planner takes a ``rank`` (each rank yields its own share).

    Raises:
        ValueError: this rank's own ``local_error``; another rank's error (naming that rank);
            settings or lengths that differ between ranks, a ``num_replicas`` other than the
            group's size, two ranks with the same ``rank`` (naming what differs and how to fix
            it).

    Cost: none on a one-rank group; else one all-reduce of ``2 x (len(settings) + 3) + world``
    int64s, and a second one of ``2n`` int64s only when the lengths differ.
    """
    if not should_check(process_group):
        if local_error is not None:
            raise local_error
        return
    from .. import collectives

    values = [value for _, value in settings]
    count = None if lengths is None else int(len(lengths))
    lengths_digest = None if lengths is None else digest(lengths)
    agreement = collectives.agree_on_constraints(
        0, 0, 0, 1 if local_error is not None else 0, process_group, must_match=[*values, count, lengths_digest],
        each_rank=[rank] if ranked else [],
    )
    if local_error is not None:
        raise local_error
    if agreement.error_code:
        raise ValueError(
            f"{who}: rank {agreement.error_rank} of the process group failed to build it (see that rank's error "
            f"for the argument and the numbers); this rank's own arguments were valid"
        )
    *setting_ranges, count_range, digest_range = agreement.must_match_ranges
    message = input_disagreement(settings, setting_ranges, agreement.world_size, num_replicas,
                                 agreement.per_rank[0] if ranked else None, who=who)
    if message is not None:
        raise ValueError(message)
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

