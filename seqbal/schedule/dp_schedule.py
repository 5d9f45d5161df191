""":class:`DPSchedule`, the result of :func:`~seqbal.schedule.build.build_dp_schedule`, and the one
function that assembles it from a partition, its slot grid and its bin workloads.

Every route of the schedule (aligned slots, ``equal_samples``, the padded schedule) ends in
:func:`_schedule_of`, so a schedule's fields and summary are computed the same way whichever
route built it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Optional, Sequence, Union

import numpy as np


@dataclass(frozen=True)
class DPSchedule:
    """A global plan: which samples every DP rank gets and how they form its micro-batches.

    Attributes:
        dp_size: number of data-parallel ranks.
        max_token_len: the cap every micro-batch respects.
        num_micro_batches: micro-batches per rank (the same on every rank).
        micro_batches: per rank, per micro-batch slot, the global sample indices (ascending).
            Slot ``i`` carries similar work on every rank (see :meth:`step_efficiency`), and the
            slots run in the same order on every rank.
        rank_indices: per rank, the global sample indices in micro-batch order, i.e. the
            concatenation of that rank's micro-batches. Send ``batch[list(rank_indices[r])]`` to
            rank ``r``; its micro-batches are then the contiguous slices of
            :meth:`local_micro_batches`.
        lengths: the tokens of every sample (kept for :meth:`summary`).
        workloads: the workload of every sample (kept for :meth:`summary`).

    Everything is a tuple, so a schedule is immutable and hashable. Convert to a list before
    indexing a tensor (a tuple index means one index per dimension to torch).
    """

    dp_size: int
    max_token_len: int
    num_micro_batches: int
    micro_batches: tuple[tuple[tuple[int, ...], ...], ...]
    rank_indices: tuple[tuple[int, ...], ...]
    lengths: tuple[int, ...] = field(repr=False)
    workloads: tuple[int, ...] = field(repr=False)

    def __repr__(self) -> str:
        """The shape of the schedule, not its micro-batches (``rank_micro_batches`` lists those).

        >>> from seqbal import build_dp_schedule  # its own module imports this one
        >>> build_dp_schedule([6, 2, 5, 3, 4, 4], dp_size=2, max_token_len=8)
        <DPSchedule dp_size=2 num_micro_batches=2 max_token_len=8 samples=6 tokens=24>
        """
        return (f"<DPSchedule dp_size={self.dp_size} num_micro_batches={self.num_micro_batches} "
                f"max_token_len={self.max_token_len} samples={len(self.lengths)} tokens={sum(self.lengths)}>")

    def rank_micro_batches(self, rank: int) -> list[list[int]]:
        """Micro-batches of ``rank`` as lists of global sample indices. O(n / dp_size).

        >>> from seqbal import build_dp_schedule  # its own module imports this one
        >>> build_dp_schedule([6, 2, 5, 3, 4, 4], dp_size=2, max_token_len=8).rank_micro_batches(1)
        [[3, 5], [2]]
        """
        return [list(mb) for mb in self.micro_batches[rank]]

    def local_micro_batches(self, rank: int) -> list[list[int]]:
        """Micro-batches of ``rank`` as positions in ``rank_indices[rank]``: contiguous ranges.

        >>> from seqbal import build_dp_schedule  # its own module imports this one
        >>> s = build_dp_schedule([5, 3, 4, 4], dp_size=2, max_token_len=8)
        >>> s.local_micro_batches(0)
        [[0, 1]]
        """
        result, offset = [], 0
        for mb in self.micro_batches[rank]:
            result.append(list(range(offset, offset + len(mb))))
            offset += len(mb)
        return result

    def step_efficiency(self) -> dict[str, float]:
        """How close a training step on this schedule comes to perfect balance, under two sync models.

        With ``W[r][i]`` the workload of rank ``r``'s ``i``-th micro-batch (sum of its samples'
        :attr:`workloads`), ``m`` micro-batches per rank and ``limit = sum(W) / dp_size`` (the
        step if every rank did exactly the mean work):

        * ``per_micro_batch = limit / sum_i max_r W[r][i]``: ranks wait for each other at every
          micro-batch (FSDP all-gathers and reduce-scatters parameters in every forward and
          backward), so slot ``i`` costs its slowest rank's micro-batch;
        * ``per_step = limit / max_r sum_i W[r][i]``: ranks sync once per step (DDP's gradient
          all-reduce after the last micro-batch), so the step costs the slowest rank's total.

        Both are in ``(0, 1]``, 1.0 is perfect, and ``per_micro_batch <= per_step``. An empty
        workload gives 1.0. O(n).

        >>> from seqbal import build_dp_schedule  # its own module imports this one
        >>> s = build_dp_schedule([5, 3, 4, 4], dp_size=2, max_token_len=8)
        >>> s.step_efficiency()["per_step"] > 0.999
        True
        """
        work = np.asarray(self.workloads, dtype=np.int64)
        grid = np.array([[int(work[list(mb)].sum()) for mb in rank] for rank in self.micro_batches], dtype=np.float64)
        limit = grid.sum() / self.dp_size
        if limit <= 0:
            return {"per_micro_batch": 1.0, "per_step": 1.0}
        return {
            "per_micro_batch": float(limit / grid.max(axis=0).sum()),
            "per_step": float(limit / grid.sum(axis=1).max()),
        }

    def summary(self) -> dict[str, Any]:
        """Metrics of the schedule, for logging. O(n).

        Keys: ``dp_size``, ``num_micro_batches`` (per rank), ``total_micro_batches``,
        ``lower_bound`` (``ceildiv(total tokens, cap)``, micro-batches over all ranks),
        ``fill`` (total tokens / (total micro-batches * cap)), ``tokens_per_rank``,
        ``workload_per_rank``, ``rank_workload_imbalance`` (max / mean over ranks, 1.0 is
        perfect), ``tokens_per_micro_batch`` and ``workload_per_micro_batch`` (per rank, per
        micro-batch), ``max_tokens`` (largest micro-batch), ``micro_batch_workload_imbalance``
        (max / mean over all micro-batches).

        >>> from seqbal import build_dp_schedule  # its own module imports this one
        >>> build_dp_schedule([5, 3, 4, 4], dp_size=2, max_token_len=8).summary()["tokens_per_rank"]
        [8, 8]
        """
        lengths = np.asarray(self.lengths, dtype=np.int64)
        work = np.asarray(self.workloads, dtype=np.int64)
        mb_tokens = [[int(lengths[list(mb)].sum()) for mb in rank] for rank in self.micro_batches]
        mb_work = [[int(work[list(mb)].sum()) for mb in rank] for rank in self.micro_batches]
        rank_work = [sum(w) for w in mb_work]
        all_work = [w for rank in mb_work for w in rank]
        total_mb = self.num_micro_batches * self.dp_size
        total = int(lengths.sum())

        def ratio(values: list[int]) -> float:
            mean = sum(values) / len(values)
            return max(values) / mean if mean > 0 else 1.0

        return {
            "dp_size": self.dp_size,
            "num_micro_batches": self.num_micro_batches,
            "total_micro_batches": total_mb,
            "lower_bound": -(-total // self.max_token_len),
            "fill": total / (total_mb * self.max_token_len),
            "tokens_per_rank": [sum(t) for t in mb_tokens],
            "workload_per_rank": rank_work,
            "rank_workload_imbalance": ratio(rank_work),
            "tokens_per_micro_batch": mb_tokens,
            "workload_per_micro_batch": mb_work,
            "max_tokens": max(t for rank in mb_tokens for t in rank),
            "micro_batch_workload_imbalance": ratio(all_work),
        }

@dataclass(frozen=True)
class SlotOrder:
    """How a schedule orders its slots (see :mod:`seqbal.order`): ``order`` is ``"pipeline"``,
    ``"largest_first"`` or None (``use_dynamic_bsz_balance=False``: heaviest slot first);
    ``measured`` is each sample's cost against the cap and ``padded`` whether a micro-batch
    costs ``samples x longest`` (what ``"largest_first"`` sizes micro-batches by)."""

    order: Optional[str] = "pipeline"
    measured: Optional[np.ndarray] = field(default=None, compare=False)
    padded: bool = False

    def sizes(self, micro: Sequence[Sequence[int]]) -> list[int]:
        """Each micro-batch's cost against the cap (sample index lists). O(n)."""
        assert self.measured is not None
        if self.padded:
            return [len(mb) * int(self.measured[list(mb)].max()) if len(mb) else 0 for mb in micro]
        return [int(self.measured[list(mb)].sum()) for mb in micro]


def _slot_order(
    grid: list[list[int]], bin_work: Sequence[int], pipeline: Union[bool, Optional[str]],
    bin_size: Optional[Sequence[int]] = None,
) -> list[int]:
    """Order of the slots, the same on every rank: by slot workload (the sum over ranks),
    heaviest first, then with ``pipeline`` (True or ``"pipeline"``) the rule of
    ``use_dynamic_bsz_balance``: ``parts[::2][::-1] + parts[1::2]`` of that order (light slots at
    both ends). With ``"largest_first"``: by the slot's largest micro-batch (``bin_size``),
    largest first, ties by slot workload, then slot. O(m log m)."""
    totals = [sum(int(bin_work[b]) for b in row) for row in grid]
    if pipeline == "largest_first":
        assert bin_size is not None
        largest = [max(int(bin_size[b]) for b in row) for row in grid]
        return sorted(range(len(grid)), key=lambda s: (-largest[s], -totals[s], s))
    ranked = sorted(range(len(grid)), key=lambda s: (-totals[s], s))
    return ranked[::2][::-1] + ranked[1::2] if pipeline in (True, "pipeline") else ranked


def _group_maxima(values: np.ndarray, groups: list[list[int]], sizes: np.ndarray) -> np.ndarray:
    """Largest value of each (non-empty) group, in one NumPy pass like ``_part_sums``. O(n)."""
    flat = np.fromiter((i for group in groups for i in group), dtype=np.int64, count=int(sizes.sum()))
    return np.maximum.reduceat(values[flat], np.cumsum(sizes) - sizes)


def _schedule_of(
    array: np.ndarray,
    work: np.ndarray,
    groups: list[list[int]],
    parts: list[list[int]],
    grid: list[list[int]],
    bin_work: Sequence[int],
    dp_size: int,
    max_token_len: int,
    order: SlotOrder,
) -> DPSchedule:
    """The DPSchedule of micro-batches ``parts`` (group indices) laid out as ``grid``
    (``grid[s][r]``: the part rank ``r`` runs in slot ``s``), slots in :func:`_slot_order`."""
    if len(groups) == len(array):  # a group per sample, in sample order (see _groups): group g is sample g
        micro = [sorted(part) for part in parts]
    else:
        micro = [sorted(i for g in part for i in groups[g]) for part in parts]
    sizes = order.sizes(micro) if order.order == "largest_first" else None
    order = _slot_order(grid, bin_work, order.order, sizes)
    per_rank = [tuple(tuple(micro[grid[s][r]]) for s in order) for r in range(dp_size)]
    per_rank.sort(key=lambda r: min(mb[0] for mb in r))  # rank 0 holds sample 0: stable across ties
    return DPSchedule(
        dp_size=dp_size,
        max_token_len=max_token_len,
        num_micro_batches=len(parts) // dp_size,
        micro_batches=tuple(per_rank),
        rank_indices=tuple(tuple(chain.from_iterable(r)) for r in per_rank),
        lengths=tuple(array.tolist()),
        workloads=tuple(work.tolist()),
    )
