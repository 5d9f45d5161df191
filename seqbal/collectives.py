"""Every torch.distributed call of seqbal lives here.

Data-parallel ranks that must run the same number of micro-batches agree with exactly two
all-reduces per call, whatever the data:

1. one packed MAX all-reduce of what the ranks must know before anyone may raise: each rank's
   proposed count, its largest forced-group token count, its (negated) number of groups, an
   error code, and the arguments every rank must pass identically (each as itself and negated,
   so that the MAX gives their minimum too and a mismatch is seen alike on every rank). Errors travel *inside* this collective on purpose: if a rank raised before
   joining it, its peers would block in the all-reduce until the process-group timeout (a hang
   of many minutes on a cluster). After it, every rank knows whether any rank failed, and all
   raise together;
2. one MIN all-reduce of "every micro-batch is within the cap" after partitioning at the agreed
   count. The partitioner makes this pass the first time (a count feasible on a rank stays
   feasible at any larger count up to its number of groups); the loop around it exists only so
   that a bug can never let a rank go on with an over-cap micro-batch. The same integer also
   carries "partitioning raised on this rank", so that an unexpected exception after the first
   all-reduce is agreed too instead of leaving the peers blocked in this one.

Rank identities are packed into the same integers (``value * world + rank``) so that the MAX
also tells which rank failed or has the fewest groups, without a third collective.

``loss_weights`` needs sums (loss tokens and sequences over the ranks), not maxima: its one
SUM all-reduce (:func:`sum_with_error`) carries the error agreement as one slot per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = [
    "Agreement",
    "LimitCheck",
    "is_sync_mode",
    "is_process_group",
    "agree_on_constraints",
    "check_within_limit",
    "SumAgreement",
    "sum_with_error",
    "global_rank",
    "min_and_max",
    "gather_objects",
]


def is_sync_mode(dp_group: Optional[Any], same_micro_num_in_dp: bool) -> bool:
    """True when ranks of ``dp_group`` must agree on one micro-batch count (SPEC's sync mode)."""
    return bool(same_micro_num_in_dp) and dp_group is not None and dist.is_available() and dist.is_initialized()


def is_process_group(value: Any) -> bool:
    """True when ``value`` is a torch.distributed ProcessGroup (what ``dp_group`` must be)."""
    return dist.is_available() and isinstance(value, dist.ProcessGroup)


#: Backends that take CPU tensors. Anything else (NCCL, HCCL on Ascend, XCCL, ...) is a device
#: backend and takes tensors on the current accelerator.
_CPU_BACKENDS = ("gloo", "mpi")


def _collective_device(group: Any) -> torch.device:
    """Where the group's backend wants its tensors: the CPU for gloo (also when it is one part of
    a mixed ``"cpu:gloo,cuda:nccl"`` backend), else the current accelerator device.

    The accelerator comes from ``torch.accelerator`` (CUDA, Ascend NPU, XPU, ...), falling back
    to CUDA on torch builds without it, and to the CPU if there is no accelerator at all.
    """
    backend = str(dist.get_backend(group)).lower()
    parts = [part.rsplit(":", 1)[-1].strip() for part in backend.split(",")]
    if any(part in _CPU_BACKENDS for part in parts):
        return torch.device("cpu")
    accelerator_api = getattr(torch, "accelerator", None)
    if accelerator_api is not None and hasattr(accelerator_api, "current_accelerator"):
        accelerator = accelerator_api.current_accelerator()
        if accelerator is not None:
            return torch.device(accelerator.type, accelerator_api.current_device_index())
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(frozen=True)
class Agreement:
    """What the first all-reduce established, identical on every rank of the group.

    Attributes:
        count: the largest proposed micro-batch count over the ranks.
        max_group_tokens: the largest forced-group token count on any rank.
        min_groups: the smallest number of forced groups any rank holds.
        min_groups_rank: a rank (group-local) holding ``min_groups`` groups.
        error_code: the largest error code raised locally by any rank, 0 if none.
        error_rank: the rank (group-local) that reported ``error_code``, -1 if none.
        world_size: size of the group.
        must_match_ranges: for each value passed as ``must_match``, ``(min, max)`` over the
            ranks that gave one, or None if no rank did; the ranks agree on it iff min == max.
        per_rank: for each value passed as ``each_rank``, every rank's value in rank order
            (group-local), None where a rank gave none.
    """

    count: int
    max_group_tokens: int
    min_groups: int
    min_groups_rank: int
    error_code: int
    error_rank: int
    world_size: int
    must_match_ranges: tuple[Optional[tuple[int, int]], ...] = ()
    per_rank: tuple[tuple[Optional[int], ...], ...] = ()


# Below every valid entry (values are >= 0, negated ones <= 0 and > this): a rank with no value
# to compare (its arguments were invalid) sends it and drops out of the MAX.
_ABSENT = -(2**63)


def agree_on_constraints(
    proposal: int,
    max_group_tokens: int,
    num_groups: int,
    error_code: int,
    group: Any,
    must_match: Sequence[Optional[int]] = (),
    each_rank: Sequence[Optional[int]] = (),
) -> Agreement:
    """All-reduce (MAX) the local facts in one int64 tensor and decode the agreement.

    Every count argument must be a non-negative int (``error_code`` 0 means no local error). A
    rank with an error still calls this: that is what keeps its peers from hanging.
    ``must_match`` holds the values every rank must pass identically (ints in [0, 2**63 - 1],
    None for "this rank has no valid value"); each travels as itself and negated, so the one
    MAX yields both its maximum and its minimum. Every rank must pass the same number of them.
    ``each_rank`` holds values (ints in [0, 2**63 - 1], or None) that every rank must learn from
    every other (a rank's claimed position among the replicas): each takes ``world`` slots, the
    rank's own slot holds its value and the others drop out of the MAX, so the one all-reduce
    returns them all. Tensor: ``4 + 2 x len(must_match) + world x len(each_rank)`` int64s.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    error_entry = error_code * world + rank if error_code > 0 else -1
    # -num_groups * world + rank: MAX picks the fewest groups (largest rank on ties), and
    # (v // world, v % world) recovers both because 0 <= rank < world.
    groups_entry = -num_groups * world + rank
    matched = [entry for value in must_match for entry in ((_ABSENT, _ABSENT) if value is None else (value, -value))]
    slots = [_ABSENT if value is None or r != rank else value for value in each_rank for r in range(world)]
    packed = torch.tensor(
        [proposal, max_group_tokens, groups_entry, error_entry, *matched, *slots],
        dtype=torch.int64,
        device=_collective_device(group),
    )
    dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=group)
    count, group_tokens, groups_value, error_value, *rest = packed.cpu().tolist()
    matched_values, slot_values = rest[: len(matched)], rest[len(matched):]
    if error_value >= 0:
        agreed_code, agreed_rank = divmod(error_value, world)
    else:
        agreed_code, agreed_rank = 0, -1
    ranges = tuple(
        None if high == _ABSENT else (-negated_low, high)
        for high, negated_low in zip(matched_values[0::2], matched_values[1::2])
    )
    return Agreement(
        count=int(count),
        max_group_tokens=int(group_tokens),
        min_groups=-(groups_value // world),
        min_groups_rank=groups_value % world,
        error_code=int(agreed_code),
        error_rank=int(agreed_rank),
        world_size=world,
        must_match_ranges=ranges,
        per_rank=tuple(
            tuple(None if v == _ABSENT else int(v) for v in slot_values[i * world:(i + 1) * world])
            for i in range(len(each_rank))
        ),
    )


@dataclass(frozen=True)
class LimitCheck:
    """What the second all-reduce established, identical on every rank of the group.

    Attributes:
        within_limit: every rank's partition respects the cap (False if any rank failed).
        failed_rank: a rank (group-local) whose partitioning raised, -1 if none did.
    """

    within_limit: bool
    failed_rank: int


def check_within_limit(within_limit: bool, failed: bool, group: Any) -> LimitCheck:
    """All-reduce (MIN) of one int per rank: ``rank`` if it failed, ``world + rank`` if over the
    cap, ``2 * world`` if within it. MIN picks a failure first, then an over-cap rank."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    value = rank if failed else (2 * world if within_limit else world + rank)
    flag = torch.tensor([value], dtype=torch.int64, device=_collective_device(group))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    agreed = int(flag.item())
    return LimitCheck(within_limit=agreed == 2 * world, failed_rank=agreed if agreed < world else -1)


@dataclass(frozen=True)
class SumAgreement:
    """What :func:`sum_with_error` established, identical on every rank of the group.

    Attributes:
        sums: each value summed over the ranks (exact: int64).
        error_code: the largest error code any rank sent, 0 if none.
        error_rank: the rank (group-local) that sent ``error_code`` (the highest on ties), -1
            if none.
        world_size: size of the group.
        per_rank: each rank's own ``per_rank`` values, in rank order (group-local): the values
            a rank must agree on (arguments) or that a SUM cannot combine (a maximum).
    """

    sums: tuple[int, ...]
    error_code: int
    error_rank: int
    world_size: int
    per_rank: tuple[tuple[int, ...], ...] = ()


def sum_with_error(values: Sequence[int], error_code: int, group: Any, per_rank: Sequence[int] = ()) -> SumAgreement:
    """One SUM all-reduce of ``values`` (non-negative ints) and of every rank's error code.

    The loss weights need global counts and the agreement on errors in the same collective
    (a rank that raised before it would leave its peers blocked in it). A SUM cannot take a
    maximum, so each rank writes its error code into its own slot of a ``world``-long tail:
    the sum then holds every rank's code, and all ranks pick the same one (largest code,
    highest rank on ties, as :func:`agree_on_constraints` does). A failing rank sends zeros as
    its values. ``per_rank`` (ints within int64, the same count on every rank) travel the same
    way, each rank's in its own slots, and come back as every rank's values: what the ranks must
    agree on, and what a SUM cannot combine (a maximum). Tensor:
    ``len(values) + world * (1 + len(per_rank))`` int64s.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    width = 1 + len(per_rank)
    slots = [0] * (world * width)
    slots[rank * width:(rank + 1) * width] = [int(error_code), *map(int, per_rank)]
    packed = torch.tensor([*map(int, values), *slots], dtype=torch.int64, device=_collective_device(group))
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    reduced = packed.cpu().tolist()
    sums, tail = reduced[: len(values)], reduced[len(values):]
    rows = [tail[r * width:(r + 1) * width] for r in range(world)]
    failing = [(row[0], r) for r, row in enumerate(rows) if row[0] > 0]
    code, failed_rank = max(failing) if failing else (0, -1)
    return SumAgreement(sums=tuple(sums), error_code=code, error_rank=failed_rank, world_size=world,
                        per_rank=tuple(tuple(row[1:]) for row in rows))


def global_rank(group: Any, rank_in_group: int) -> int:
    """The global rank of ``rank_in_group`` of ``group`` (itself for the default group)."""
    try:
        return dist.get_global_rank(group, rank_in_group)
    except (ValueError, RuntimeError, AttributeError):
        return rank_in_group


def min_and_max(values: Sequence[int], group: Any) -> tuple[Any, Any]:
    """Elementwise minimum and maximum of ``values`` (ints within int64, the same count on every
    rank) over the ranks of ``group``: one MAX all-reduce of ``2n`` int64s (each value and its
    negation). Returns two int64 NumPy arrays."""
    import numpy as np

    array = np.asarray(values, dtype=np.int64)
    packed = torch.from_numpy(np.concatenate([array, -array])).to(_collective_device(group))
    dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=group)
    reduced = packed.cpu().numpy()
    return -reduced[len(array):], reduced[: len(array)]


def gather_objects(value: Any, group: Any) -> list[Any]:
    """Every rank's picklable ``value``, in rank order (group-local), identical on every rank:
    one ``all_gather_object`` call. The step planner sends each rank's arrivals and the facts
    every rank must agree on through it, so that every check after it sees the same data on
    every rank and raises alike, with no second collective."""
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def first_disagreement(facts: Sequence[Sequence[Any]], names: Sequence[str]) -> Optional[tuple[str, Any, int, Any]]:
    """The first fact some rank holds differently from rank 0, in gathered ``facts`` (one
    sequence per rank, in rank order, as :func:`gather_objects` returns them): ``(name, rank 0's
    value, rank, that rank's value)``, or None when every rank agrees. Every rank computes the
    same answer from the same gathered facts, so every rank raises alike. O(ranks x facts)."""
    for rank, theirs in enumerate(facts):
        for name, mine, their in zip(names, facts[0], theirs):
            if mine != their:
                return name, mine, rank, their
    return None
