"""Driver-side planning: a global data-parallel schedule, and balanced splits over DP ranks.

A single controller that holds the whole rollout batch can decide, before any worker starts,
which samples each data-parallel (DP) rank gets and how they form micro-batches, with no
collective at all. Two entry points:

* :func:`build_dp_schedule` decides everything: ranks *and* micro-batches.
* :func:`balance_batch` only splits the batch over ranks (balanced workload, uid groups kept
  together); each worker then micro-batches its share itself with ``rearrange_micro_batches``.

Design of the schedule: **pack first, distribute second.** Splitting the batch over ranks first
and packing each share afterwards fixes every rank's share before anyone knows how well it
packs; the ranks must then all run the count of the *worst-packing* rank, and its padding-free
waste is paid on every rank. Packing the whole batch under the cap first uses the slack of all
ranks together, so the count per rank is ``ceil(global bins / dp_size)`` instead of the maximum
of the per-rank counts: never more, and fewer on heavy-tailed data where one rank's few long
samples would otherwise force extra micro-batches on everybody.

The bins are then handed out as **aligned slots**, not only as balanced ranks. Under FSDP every
micro-batch gathers and scatters parameters, so ranks wait for each other at every micro-batch
and a step costs the sum over slots of the slowest rank's micro-batch in that slot; balancing
whole ranks (all that DDP's once-per-step all-reduce needs) leaves slot ``i`` holding unrelated
micro-batches on different ranks. So the bins are sorted by workload and cut into slots of
``dp_size``, each slot is evened out with group moves and swaps under the cap, each slot's bins
are placed on ranks so that rank totals balance as well, and the slots run in the same order on
every rank (the pipeline order of ``use_dynamic_bsz_balance``). The alternative, ordering each
rank's micro-batches after a rank-level assignment, cannot move work between ranks any more.

``equal_samples=True`` (verl dispatches equal chunks) splits the groups over ranks first, in
equal numbers, and packs each share: the pack-first advantage is given up for equal sample
counts, and only count-preserving swaps even the slots out.

The bin count is rounded **up** to a multiple of ``dp_size * num_batches_divided_by`` (and to
at least ``dp_size * min_num_micro_batch``), never down: a count below what the cap needs
cannot be repaired later, while a larger count is always reachable by splitting bins, and a
split never breaks the cap (each half holds less than the bin it came from). The price is a
few micro-batches fewer than full; the alternative, rounding down and overshooting the cap,
is an out-of-memory crash.

Everything here is pure Python/NumPy on plain lengths and deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Sequence, Union

import numpy as np

from .cost import CostModel, as_cost_model, padded_min_count, padded_partitions
from .metrics import log_seqlen_unbalance
from .partition import (
    INT64_SAFE_TOTAL,
    best_fit_decreasing_partitions,
    capped_balanced_partitions,
    check_int64_sums,
    karmarkar_karp,
    packing_lower_bound,
    roundup_divisible,
    smallest_feasible_partitions,
)
from .partition.parts import _part_sums
from .validation import balance_workloads, int_argument, int_array
from .workload import calculate_workload

__all__ = ["DPSchedule", "build_dp_schedule", "balance_batch", "get_group_balanced_partitions"]

WorkloadFn = Callable[[Any], Any]


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _lengths_array(lengths: Any) -> np.ndarray:
    """Lengths as a 1-D int64 array; ValueError on anything else (tensors are accepted)."""
    return int_array(
        lengths, "lengths", samples=True, integral_floats=False, sums=False,
        empty="lengths is empty (0 samples): nothing to schedule",
    )


def _workloads(lengths: np.ndarray, workload_fn: Optional[WorkloadFn]) -> np.ndarray:
    values = np.asarray((workload_fn or calculate_workload)(lengths))
    if values.shape != lengths.shape:
        raise ValueError(f"workload_fn returned shape {values.shape} for lengths of shape {lengths.shape}")
    if not np.issubdtype(values.dtype, np.integer):
        # Integer workloads keep KK exact and deterministic; round float models once here.
        values = np.rint(values.astype(np.float64))
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(
                f"workload_fn returned {values[bad[0]]} for sample {int(bad[0])} (length {int(lengths[bad[0]])}); "
                f"workloads must be finite"
            )
        if values.size and np.abs(values).max() > INT64_SAFE_TOTAL:
            index = int(np.argmax(np.abs(values)))
            raise ValueError(f"workload_fn returned {values[index]:.4g} for sample {index}, beyond int64 sums")
    elif values.dtype.kind == "u" and values.size and int(values.max()) > INT64_SAFE_TOTAL:
        index = int(np.argmax(values))
        raise ValueError(f"workload_fn returned {int(values[index])} for sample {index}, beyond int64 sums")
    values = values.astype(np.int64)
    if (values < 0).any():
        index = int(np.argmax(values < 0))
        raise ValueError(f"workload_fn returned a negative workload ({int(values[index])}) for sample {index}")
    return values


def _groups(
    n: int, force_group_size: int, group_ids: Optional[Sequence[Hashable]]
) -> list[list[int]]:
    """Sample indices of every group, groups in order of first appearance, indices ascending."""
    force_group_size = int_argument("force_group_size", force_group_size, expected="an int >= 1")
    if group_ids is not None:
        if hasattr(group_ids, "tolist"):  # tensors and arrays: group by value, not by element object
            group_ids = group_ids.tolist()
        if not hasattr(group_ids, "__len__") or not hasattr(group_ids, "__getitem__"):
            raise ValueError(
                f"group_ids must be a sequence (list, tuple, array or tensor) of n hashable ids, got "
                f"{type(group_ids).__name__}"
            )
        if force_group_size != 1:
            raise ValueError(
                f"give either force_group_size (got {force_group_size}) or group_ids, not both: "
                f"set force_group_size=1 when passing group_ids"
            )
        if len(group_ids) != n:
            raise ValueError(f"lengths has {n} entries but group_ids has {len(group_ids)}")
        members: dict[Hashable, list[int]] = {}
        for index, uid in enumerate(group_ids):
            try:
                members.setdefault(uid, []).append(index)
            except TypeError:
                raise ValueError(
                    f"group_ids[{index}] is {uid!r} of type {type(uid).__name__}, which is not hashable"
                ) from None
        return list(members.values())
    if n % force_group_size:
        raise ValueError(f"force_group_size={force_group_size} does not divide the batch size {n}")
    g = force_group_size
    return [list(range(start, start + g)) for start in range(0, n, g)]


def _optional_count(name: str, value: Any) -> Optional[int]:
    return int_argument(name, value, optional=True, expected="None or an int >= 1")


# ---------------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------------


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

        >>> build_dp_schedule([6, 2, 5, 3, 4, 4], dp_size=2, max_token_len=8)
        <DPSchedule dp_size=2 num_micro_batches=2 max_token_len=8 samples=6 tokens=24>
        """
        return (f"<DPSchedule dp_size={self.dp_size} num_micro_batches={self.num_micro_batches} "
                f"max_token_len={self.max_token_len} samples={len(self.lengths)} tokens={sum(self.lengths)}>")

    def rank_micro_batches(self, rank: int) -> list[list[int]]:
        """Micro-batches of ``rank`` as lists of global sample indices. O(n / dp_size).

        >>> build_dp_schedule([6, 2, 5, 3, 4, 4], dp_size=2, max_token_len=8).rank_micro_batches(1)
        [[3, 5], [2]]
        """
        return [list(mb) for mb in self.micro_batches[rank]]

    def local_micro_batches(self, rank: int) -> list[list[int]]:
        """Micro-batches of ``rank`` as positions in ``rank_indices[rank]``: contiguous ranges.

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


def _largest_fitting_divisor(floor: int, dp_size: int, divisor: int, num_groups: int) -> Optional[int]:
    """The largest ``d <= divisor`` with ``roundup_divisible(floor, dp_size * d) <= num_groups``, or
    None if none exists. O(sqrt(num_groups / dp_size)), whatever ``divisor`` is.

    With ``m = dp_size * d`` and ``q = ceildiv(floor, m)``, ``d`` fits exactly when some ``q``
    has ``q * m <= num_groups`` and ``q * m >= floor``. For a given ``q`` the largest ``d`` is
    ``min(divisor, num_groups // (q * dp_size))``, which never grows with ``q``: so the answer is
    that ``d`` for the smallest ``q`` where it fits. ``d`` takes one value over a run of ``q``,
    and ``q * m >= floor`` is easiest at the run's largest ``q``, so each run is tried once:
    ``O(sqrt(num_groups / dp_size))`` runs, instead of one try per divisor (hours at ``2**40``).
    """
    if floor > num_groups:
        return None  # every multiple of anything is at least floor
    q = max(1, num_groups // (dp_size * divisor))
    while True:
        d = min(divisor, num_groups // (q * dp_size))
        if d < 1:
            return None
        q = num_groups // (d * dp_size)  # the largest q that still allows this d
        if q * d * dp_size >= floor:
            return d
        q += 1


def _too_few_groups(
    needed: int,
    packed: int,
    num_groups: int,
    dp_size: int,
    max_token_len: int,
    divisor: Optional[int],
    min_num_micro_batch: Optional[int],
) -> ValueError:
    """The error for a bin count larger than the number of groups, with the settings to change."""
    advice = []
    if packed > num_groups // dp_size * dp_size:
        advice.append(f"raise max_token_len (the cap alone needs {packed} micro-batches)")
    if dp_size > num_groups:
        advice.append(f"use dp_size <= {num_groups}")
    per_rank = num_groups // dp_size
    if divisor is not None and divisor > 1:
        floor = max(packed, dp_size * (min_num_micro_batch or 1))
        fit = _largest_fitting_divisor(floor, dp_size, divisor, num_groups)
        if fit is not None and fit < divisor:
            advice.append(f"lower num_batches_divided_by to {fit}")
    if min_num_micro_batch is not None and dp_size * min_num_micro_batch > num_groups and per_rank >= 1:
        advice.append(f"lower min_num_micro_batch to {per_rank}")
    advice.append(f"or give the batch at least {needed} groups")
    return ValueError(
        f"Cannot satisfy max_token_len={max_token_len}: the schedule needs {needed} micro-batches "
        f"({needed // dp_size} per rank on dp_size={dp_size}: {packed} to respect the cap (best-fit packing), rounded up to a "
        f"multiple of dp_size * num_batches_divided_by = {dp_size * (divisor or 1)}"
        f"{f' and to at least dp_size * min_num_micro_batch = {dp_size * min_num_micro_batch}' if min_num_micro_batch else ''}"
        f"), but only {num_groups} group(s) of samples can fill them; " + "; ".join(advice)
    )


# ---------------------------------------------------------------------------------------------
# Aligned slots: slot i of every rank carries similar work
# ---------------------------------------------------------------------------------------------

#: A slot counts as even once its heaviest micro-batch is within this factor of the slot's mean:
#: past it a step gains less than a thousandth of a percent of the step time.
SLOT_CLOSE_ENOUGH = 1.00001
#: Micro-batches of other slots a slot's heaviest one may trade with in one step, the ones with
#: the most room below their own slot's maximum: past the few roomiest a trade rarely fits. On
#: more than ``SLOT_PARTNERS + 1`` ranks, also the most of its own slot's (the lightest).
SLOT_PARTNERS = 16
#: Passes over all slots; a pass that changes nothing ends the evening early.
SLOT_PASSES = 3


#: Groups of one bin a trade looks at, at most: beyond it, evenly spaced ranks of the bin's
#: groups by workload (a bin of thousands of short samples would make a step quadratic in them).
TRADE_ITEMS = 24
#: Heavy groups (the lightest of those a trade looks at) scored first for swaps: most steps find
#: their best swap among them, and skip the rest.
SWAP_FIRST_ROWS = 4
#: Trades per slot per pass, at most.
SLOT_STEPS = 64
#: Trade attempts over all slots and passes, per slot (plus 64): bounds the evening at
#: O(slots) vectorised steps whatever the data.
SLOT_BUDGET_PER_SLOT = 64


def _some(items: list[int], work: np.ndarray) -> list[int]:
    """``items``, or :data:`TRADE_ITEMS` of them at evenly spaced workload ranks. O(s log s)."""
    if len(items) <= TRADE_ITEMS:
        return items
    array = np.asarray(items, dtype=np.int64)
    ranked = array[np.argsort(work[array], kind="stable")]
    # strictly increasing positions (the step (s - 1) / (TRADE_ITEMS - 1) is at least 1 here)
    return ranked[(np.arange(TRADE_ITEMS) * (len(array) - 1)) // (TRADE_ITEMS - 1)].tolist()


def _slots_from_bins(parts: list[list[int]], bin_work: Sequence[int], dp: int) -> list[list[int]]:
    """Bins sorted by workload (heaviest first, ties by first group), cut into slots of ``dp``.

    Grouping consecutive bins of the sorted order minimises the sum over slots of the heaviest
    bin in the slot (an exchange argument), which is the step time when ranks sync at every
    micro-batch. O(t log t).
    """
    order = sorted(range(len(parts)), key=lambda b: (-int(bin_work[b]), parts[b][0] if parts[b] else -1))
    return [order[start:start + dp] for start in range(0, len(order), dp)]


def _even_slots(
    parts: list[list[int]],
    slots: list[list[int]],
    tokens: np.ndarray,
    work: np.ndarray,
    capacity: int,
    *,
    moves: bool,
) -> list[list[int]]:
    """Lower the sum over slots of each slot's heaviest bin: single-group moves and swaps between
    a slot's heaviest bin and another bin, within the cap, never emptying a bin.

    The partner is another bin of the same slot (with more than ``SLOT_PARTNERS + 1`` ranks, one
    of its :data:`SLOT_PARTNERS` lightest), or one of the :data:`SLOT_PARTNERS` bins of other
    slots with the most room below their own slot's maximum (a trade that lifts such a bin but
    not above its slot's maximum costs nothing). A step applies the trade with the largest
    gain, the drop of this slot's maximum minus the rise of the partner slot's maximum; a trade
    of zero gain is taken only if it lowers the heaviest bin and lifts no slot's maximum (this
    resolves ties at the top). Slots are visited heaviest excess first, each until no trade gains
    or it is within :data:`SLOT_CLOSE_ENOUGH` of its mean, for at most :data:`SLOT_PASSES`
    passes. ``moves=False`` allows swaps only (each bin keeps its group count:
    ``equal_samples``). Every step is O(t + s * SLOT_PARTNERS * s) vectorised for ``s`` groups
    per bin and ``t`` bins; swaps skip partner groups whose bound (the gain can exceed neither
    the delta nor the partner's room) is below the best move, and score the heavy bin's first
    :data:`SWAP_FIRST_ROWS` groups (its lightest, past TRADE_ITEMS groups) first, stopping
    once they reach the step's upper bound: the same trade as the full matrix, usually at a
    fraction of its cost.
    """
    parts = [list(p) for p in parts]
    bin_tokens = _part_sums(tokens, parts).astype(np.int64)
    bin_work = _part_sums(work, parts).astype(np.int64)
    slot_of = np.empty(len(parts), dtype=np.int64)
    for index, slot in enumerate(slots):
        slot_of[slot] = index
    grid = [np.asarray(slot, dtype=np.int64) for slot in slots]
    flat_bins = np.concatenate(grid) if grid else np.zeros(0, dtype=np.int64)
    starts = np.cumsum([0] + [len(slot) for slot in slots[:-1]]).astype(np.int64)
    big = np.iinfo(np.int64).min
    cache: dict[int, np.ndarray] = {}  # bin -> the groups trades look at, until the bin changes

    def picked(b: int) -> np.ndarray:
        if b not in cache:
            cache[b] = np.asarray(_some(parts[b], work), dtype=np.int64)
        return cache[b]

    def trade(s: int) -> bool:
        slot = grid[s]
        values = bin_work[slot]
        order = np.argsort(-values, kind="stable")
        heavy, top = int(slot[order[0]]), int(values[order[0]])
        second = int(values[order[1]]) if len(slot) > 1 else 0
        third = int(values[order[2]]) if len(slot) > 2 else 0
        if top <= SLOT_CLOSE_ENOUGH * float(values.mean()):
            return False
        # the slot's other bins (on more than SLOT_PARTNERS ranks its SLOT_PARTNERS lightest), in slot order
        kept = order[1:] if len(slot) <= SLOT_PARTNERS + 1 else order[::-1][:SLOT_PARTNERS]
        partners = [int(slot[k]) for k in np.sort(kept)]
        # The SLOT_PARTNERS roomiest bins of other slots, ties by index: every bin at or above the
        # (SLOT_PARTNERS + this slot's size)-th largest room, less this slot's, then sorted. O(t).
        wanted = SLOT_PARTNERS + len(slot)
        if len(room) > wanted:
            threshold = max(int(np.partition(room, len(room) - wanted)[len(room) - wanted]), 1)
            others = np.flatnonzero(room >= threshold)
        else:
            others = np.flatnonzero(room > 0)
        others = others[slot_of[others] != s]
        others = others[np.lexsort((others, -room[others]))][:SLOT_PARTNERS]
        partners += others.tolist()
        if not partners:
            return False
        chosen = [picked(b) for b in partners]
        sizes = np.fromiter(map(len, chosen), dtype=np.int64, count=len(chosen))
        p_items = np.concatenate(chosen)
        p_bins = np.repeat(np.asarray(partners, dtype=np.int64), sizes)
        h_items = picked(heavy)
        h_work, h_tok = work[h_items], tokens[h_items]
        # what the slot's maximum is without the heavy bin and the partner
        rest = np.where(p_bins == int(slot[order[1]]) if len(slot) > 1 else False, third, second)
        p_value, p_top = bin_work[p_bins], maxima[slot_of[p_bins]]

        inside = sum(int(n) for n in sizes[:len(partners) - len(others)])  # columns of this slot's bins

        def gains(delta: np.ndarray, ok: np.ndarray, columns: Any, cut: int) -> np.ndarray:
            # columns [:cut] are bins of this slot, [cut:] of other slots: one formula each
            value = p_value[columns]
            d_in, d_out = delta[:, :cut], delta[:, cut:]
            lifted = value[None, :cut] + d_in
            gain_in = top - np.maximum(np.maximum(top - d_in, lifted), rest[columns][None, :cut])
            keep_in = ok[:, :cut] & ((gain_in > 0) | ((gain_in == 0) & (lifted < top)))
            ceiling = p_top[columns][None, cut:]
            lifted = value[None, cut:] + d_out
            gain_out = top - np.maximum(top - d_out, second) - np.maximum(0, lifted - ceiling)
            keep_out = ok[:, cut:] & ((gain_out > 0) | ((gain_out == 0) & (lifted <= ceiling)))
            return np.concatenate((np.where(keep_in, gain_in, big), np.where(keep_out, gain_out, big)), axis=1)

        best = None  # (gain, delta, kind, i, j)
        first = np.cumsum(sizes) - sizes
        if len(parts[heavy]) > 1 and moves and int(h_tok.min()) <= capacity - int(bin_tokens[p_bins[first]].min()):
            # a move depends on the partner bin only: one column per partner bin (its first item)
            delta = np.broadcast_to(h_work[:, None], (len(h_items), len(first)))
            ok = (h_tok[:, None] <= (capacity - bin_tokens[p_bins[first]])[None, :]) & (delta > 0)
            score = gains(delta, ok, first, len(partners) - len(others))
            flat = int(np.argmax(score))
            if score.flat[flat] > big:
                i, c = divmod(flat, len(first))
                best = (int(score.flat[flat]), int(delta[i, c]), 0, i, int(first[c]))
        # A swap gains at most its delta, and at most top - max(rest, partner) in this slot or
        # min(top - second, the partner's room) in another: columns that cannot reach the best
        # move's gain (or that no heavy group outweighs) cannot win, and are left out.
        p_work = work[p_items]
        bound = np.minimum(h_work.max() - p_work, np.concatenate((
            top - np.maximum(rest[:inside], p_value[:inside]),
            np.minimum(top - second, p_top[inside:] - p_value[inside:]),
        )))
        keep = np.flatnonzero(bound >= (best[0] if best is not None else 0))
        if len(keep):
            k_work, k_tok, k_room = p_work[keep], tokens[p_items[keep]], capacity - bin_tokens[p_bins[keep]]
            cut, ceiling = int(np.searchsorted(keep, inside)), int(bound[keep].max())
            found = (big, -1, -1)  # (score, row, column): the first maximum in row-major order
            # Rows in two blocks: no swap gains more than ``ceiling``, so once the first block
            # reaches it the first maximum is there (usually: the block's few lightest groups).
            for rows in (slice(0, SWAP_FIRST_ROWS), slice(SWAP_FIRST_ROWS, None)):
                delta = h_work[rows, None] - k_work[None, :]
                if delta.size == 0:
                    continue
                shift = h_tok[rows, None] - k_tok[None, :]
                ok = (delta > 0) & (shift <= k_room[None, :]) & (-shift <= capacity - bin_tokens[heavy])
                score = gains(delta, ok, keep, cut)
                flat = int(np.argmax(score))
                if int(score.flat[flat]) > found[0]:
                    i, c = divmod(flat, len(keep))
                    found = (int(score.flat[flat]), i + rows.start, c)
                if found[0] >= ceiling:
                    break
            if found[0] > big:
                _, i, c = found
                candidate = (found[0], int(h_work[i] - k_work[c]), 1, i, int(keep[c]))
                if best is None or candidate[:2] > best[:2]:
                    best = candidate
        if best is None:
            return False
        _, _, kind, i, j = best
        group, target = int(h_items[i]), int(p_bins[j])
        exchanges = [(group, heavy, target)]
        if kind == 1:
            exchanges.append((int(p_items[j]), target, heavy))
        cache.pop(heavy, None)
        cache.pop(target, None)
        for g, src, dst in exchanges:
            parts[src].remove(g)
            parts[dst].append(g)
            bin_tokens[src] -= tokens[g]
            bin_tokens[dst] += tokens[g]
            bin_work[src] -= work[g]
            bin_work[dst] += work[g]
        for touched in {s, int(slot_of[target])}:
            refresh(touched)
        return True

    def refresh(s: int) -> None:  # slot s's maximum and its bins' room below it, after a trade
        maxima[s] = bin_work[grid[s]].max()
        room[grid[s]] = maxima[s] - bin_work[grid[s]]

    if all(len(slot) < 2 for slot in slots):
        return parts
    maxima = np.maximum.reduceat(bin_work[flat_bins], starts)  # every slot's heaviest bin
    room = maxima[slot_of] - bin_work  # how far each bin is below its slot's maximum
    budget = SLOT_BUDGET_PER_SLOT * len(grid) + 64  # trade attempts in all, failed ones included
    for _ in range(SLOT_PASSES):
        excess = [int(bin_work[g].max()) - float(bin_work[g].mean()) for g in grid]
        changed = False
        for s in sorted(range(len(grid)), key=lambda s: (-excess[s], s)):
            for _ in range(min(4 * sum(len(parts[b]) for b in grid[s]) + 16, SLOT_STEPS)):
                budget -= 1
                if budget < 0 or not trade(s):
                    break
                changed = True
        if not changed or budget < 0:
            break
    return [sorted(p) for p in parts]


def _ranks_within_slots(slots: list[list[int]], bin_work: Sequence[int], dp: int) -> list[list[int]]:
    """Place each slot's bins on ranks (one per rank) so that rank totals are balanced too.

    Slots in order of their heaviest bin; each slot's bins, heaviest first, go to the ranks
    lightest first (LPT across slots), then pairwise exchanges inside one slot between the
    heaviest and the lightest rank while they narrow the gap (at most ``4 * slots``). Which bin
    sits on which rank inside a slot does not change the per-micro-batch step time, only the
    per-step one. Returns the grid: ``grid[s][r]`` is the bin of rank ``r`` in slot ``s``.
    O(slots * dp log dp + exchanges * slots).
    """
    totals = [0] * dp
    grid: list[list[int]] = []
    for slot in slots:
        row = [-1] * dp
        lightest = sorted(range(dp), key=lambda r: (totals[r], r))
        for rank, b in zip(lightest, sorted(slot, key=lambda b: (-int(bin_work[b]), b))):
            row[rank] = b
            totals[rank] += int(bin_work[b])
        grid.append(row)
    for _ in range(4 * len(grid)):
        heavy = max(range(dp), key=lambda r: (totals[r], -r))
        light = min(range(dp), key=lambda r: (totals[r], r))
        diff = totals[heavy] - totals[light]
        best: Optional[tuple[int, int]] = None  # (gap after, slot)
        for s, row in enumerate(grid):
            delta = int(bin_work[row[heavy]]) - int(bin_work[row[light]])
            if 0 < delta < diff and (best is None or abs(diff - 2 * delta) < best[0]):
                best = (abs(diff - 2 * delta), s)
        if best is None:
            break
        row = grid[best[1]]
        delta = int(bin_work[row[heavy]]) - int(bin_work[row[light]])
        row[heavy], row[light] = row[light], row[heavy]
        totals[heavy] -= delta
        totals[light] += delta
    return grid


#: Steps of the rank polish per rank (see :func:`_polish_ranks`).
POLISH_STEPS_PER_RANK = 4


def _polish_ranks(
    parts: list[list[int]],
    grid: list[list[int]],
    tokens: np.ndarray,
    work: np.ndarray,
    capacity: int,
    *,
    moves: bool,
) -> list[list[int]]:
    """Even out rank totals without touching any slot's maximum: single-group moves and swaps
    between the heaviest and the lightest rank's micro-batches of one slot, where the receiving
    micro-batch stays at or below its slot's maximum and within the cap.

    Each step applies, over all slots, the trade whose shift is nearest to half the two ranks'
    gap (and below the gap); at most ``POLISH_STEPS_PER_RANK * dp`` steps, stopping when no
    trade narrows the gap or the heaviest rank is within :data:`SLOT_CLOSE_ENOUGH` of the mean. The per-micro-batch step time cannot get worse; the per-step one
    gets better. ``moves=False``: swaps only. O(steps * t * s^2) vectorised, ``s`` groups per bin.
    """
    dp = len(grid[0]) if grid else 0
    if dp < 2:
        return parts
    parts = [list(p) for p in parts]
    bin_tokens = _part_sums(tokens, parts).astype(np.int64)
    bin_work = _part_sums(work, parts).astype(np.int64)
    cells = np.asarray(grid, dtype=np.int64)  # [slots, dp] bins
    for _ in range(POLISH_STEPS_PER_RANK * dp):
        totals = bin_work[cells].sum(axis=0)
        heavy, light = int(np.argmax(totals)), int(np.argmin(totals))
        diff = int(totals[heavy] - totals[light])
        if diff <= 0 or totals[heavy] <= SLOT_CLOSE_ENOUGH * float(totals.mean()):
            break
        maxima = bin_work[cells].max(axis=1)
        best: Optional[tuple[int, int, int, int, int]] = None  # (gap, slot, kind, group out, group in)
        for slot in range(len(cells)):
            a, b = int(cells[slot, heavy]), int(cells[slot, light])
            allowance = int(maxima[slot] - bin_work[b])
            if allowance <= 0:
                continue
            a_items = np.asarray(_some(parts[a], work), dtype=np.int64)
            b_items = np.asarray(_some(parts[b], work), dtype=np.int64)
            limit = min(allowance, diff - 1)
            if moves and len(parts[a]) > 1:
                w = work[a_items]
                ok = (w > 0) & (w <= limit) & (tokens[a_items] <= capacity - bin_tokens[b])
                if ok.any():
                    gaps = np.where(ok, np.abs(diff - 2 * w), np.iinfo(np.int64).max)
                    i = int(np.argmin(gaps))
                    if best is None or int(gaps[i]) < best[0]:
                        best = (int(gaps[i]), slot, 0, int(a_items[i]), -1)
            delta = work[a_items][:, None] - work[b_items][None, :]
            shift = tokens[a_items][:, None] - tokens[b_items][None, :]
            ok = (delta > 0) & (delta <= limit) & (shift <= capacity - bin_tokens[b]) & (-shift <= capacity - bin_tokens[a])
            if ok.any():
                gaps = np.where(ok, np.abs(diff - 2 * delta), np.iinfo(np.int64).max)
                i, j = divmod(int(np.argmin(gaps)), len(b_items))
                if best is None or int(gaps[i, j]) < best[0]:
                    best = (int(gaps[i, j]), slot, 1, int(a_items[i]), int(b_items[j]))
        if best is None:
            break
        _, slot, kind, out_group, in_group = best
        a, b = int(cells[slot, heavy]), int(cells[slot, light])
        exchanges = [(out_group, a, b)] + ([(in_group, b, a)] if kind == 1 else [])
        for g, src, dst in exchanges:
            parts[src].remove(g)
            parts[dst].append(g)
            bin_tokens[src] -= tokens[g]
            bin_tokens[dst] += tokens[g]
            bin_work[src] -= work[g]
            bin_work[dst] += work[g]
    return [sorted(p) for p in parts]


def _slot_order(grid: list[list[int]], bin_work: Sequence[int], pipeline: bool) -> list[int]:
    """Order of the slots, the same on every rank: by slot workload (the sum over ranks),
    heaviest first, then with ``pipeline`` the rule of ``use_dynamic_bsz_balance``:
    ``parts[::2][::-1] + parts[1::2]`` of that order (light slots at both ends). O(m log m)."""
    totals = [sum(int(bin_work[b]) for b in row) for row in grid]
    ranked = sorted(range(len(grid)), key=lambda s: (-totals[s], s))
    return ranked[::2][::-1] + ranked[1::2] if pipeline else ranked


def _per_rank_candidate(
    tokens: np.ndarray, work: np.ndarray, capacity: int, dp_size: int, divisor: int, min_count: int
) -> Optional[list[list[int]]]:
    """The per-rank route as one global partition: KK split of the groups over ranks (equal
    counts when they divide), each share at its smallest feasible count (a multiple of
    ``divisor``, ``>= min_count``), every share then split up to the largest of those counts.
    ``None`` if some share cannot reach that count. Cost: ``dp_size`` capped searches on
    ``g / dp_size`` groups each.
    """
    g = len(tokens)
    if g < dp_size:
        return None
    shares = karmarkar_karp(work, dp_size, equal_size=g % dp_size == 0)
    plans = []
    for share in shares:
        index = np.asarray(share, dtype=np.int64)
        k, parts = smallest_feasible_partitions(tokens[index], work[index], capacity, min_count=min_count, step=divisor)
        if parts is None:
            return None
        plans.append((index, k, parts))
    count = max(k for _, k, _ in plans)
    result: list[list[int]] = []
    for index, k, parts in plans:
        if k < count:
            if count > len(index):
                return None
            parts = capped_balanced_partitions(tokens[index], work[index], capacity, count, feasible=parts)
            if parts is None:
                return None
        result.extend([int(index[i]) for i in part] for part in parts)
    return result


def build_dp_schedule(
    lengths: Sequence[int],
    dp_size: int,
    max_token_len: int,
    *,
    force_group_size: int = 1,
    group_ids: Optional[Sequence[Hashable]] = None,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    workload_fn: Optional[WorkloadFn] = None,
    cost_model: Union[None, str, CostModel] = None,
    equal_samples: bool = False,
    use_dynamic_bsz_balance: bool = True,
) -> DPSchedule:
    """Plan every DP rank's samples and micro-batches at once, on the driver, with no collective.

    Steps (see the module docstring for why in this order):
      1. form groups (``force_group_size`` consecutive samples, or equal ``group_ids``), which are
         never split; a sample or group over the cap is a ``ValueError`` naming it;
      2. pack the groups under the cap with best-fit decreasing; the bin count ``b`` is the
         fewest this packer finds;
      3. raise the count to ``t``, the smallest multiple of ``dp_size * num_batches_divided_by``
         that is ``>= b`` and ``>= dp_size * min_num_micro_batch`` (a smaller multiple is tried
         first if the cap admits one, down from the packing lower bound); the ``t`` micro-batches
         are balanced on workload with moves, swaps and splits that never break the cap
         (:func:`seqbal.partition.capped_balanced_partitions`). If ``t`` is above the lower bound, the per-rank route (KK split of the groups over
         ranks, each share packed at its own smallest count, all raised to the largest) is
         computed as well and wins if it needs fewer: the schedule never needs more
         micro-batches per rank than splitting first and packing per rank would;
      4. cut the ``t`` micro-batches into ``t / dp_size`` slots: sorted by workload, ``dp_size``
         consecutive ones per slot (this minimises the sum of the slots' heaviest micro-batch,
         the step time when ranks sync at every micro-batch, as FSDP does);
      5. even out every slot: single-group moves and swaps, within the cap, between a slot's
         heaviest micro-batch and another of the slot or a roomy one of another slot
         (:func:`_even_slots`);
      6. place each slot's micro-batches on the ranks, one each, so that rank totals balance
         too (what a once-per-step sync, DDP, waits for), then polish the rank totals with
         group trades inside a slot that keep every slot's maximum (:func:`_polish_ranks`);
         With at most :data:`FEW_SLOTS` micro-batches per rank (and at most
         :data:`FEW_SLOTS_MAX_GROUPS` groups), the per-rank route's partition
         goes through steps 4-6 as well, and the one with the smaller per-micro-batch step wins;
      7. order the slots, the same on every rank: with ``use_dynamic_bsz_balance`` the rule of
         :func:`seqbal.plan_micro_batches` (slots sorted by workload descending, then
         ``parts[::2][::-1] + parts[1::2]``: light slots at both ends for pipeline bubbles),
         else heaviest first.

    With ``equal_samples=True`` steps 2-6 become the per-rank route, aligned: the groups are
    split over the ranks in equal numbers first (KK on workload), each share is packed at the
    count every rank needs, each rank's micro-batches sorted by workload form the slots, and
    only swaps of one group for one even them out (moves would change a rank's sample count).

    Args:
        lengths: effective tokens of each sample (sequence of ints, integer array or tensor).
        dp_size: number of data-parallel ranks, >= 1.
        max_token_len: hard cap on the tokens of every micro-batch.
        force_group_size: samples ``i*g .. i*g+g-1`` stay in one micro-batch. Default 1.
        group_ids: alternatively, one hashable per sample; samples with equal ids stay in one
            micro-batch (need not be contiguous). Default None.
        num_batches_divided_by: the per-rank count must be a multiple of this (virtual pipeline
            stages). Default None.
        min_num_micro_batch: the per-rank count must be at least this. Default None.
        workload_fn: lengths -> workloads (default :func:`seqbal.calculate_workload`); float
            results are rounded to integers.
        cost_model: what ``max_token_len`` caps, as in :func:`seqbal.plan_micro_batches`:
            effective tokens (default), ``"padded"`` (``samples x longest``) or a
            :class:`~seqbal.CostModel` with rounding. Under the padded cost, steps 2-4 become:
            runs of the length-sorted groups (the fewest micro-batches for equal group sizes),
            balanced on padded workload, handed to ranks in equal numbers by KK on their
            padded workloads (no group moves between them, which could break the padded cap).
        equal_samples: every rank gets the same number of samples, as verl's equal-chunk
            dispatch (``DataProto.chunk``) needs. Requires groups of one size
            (``force_group_size``, or ``group_ids`` whose groups are all equally large) and a
            group count divisible by ``dp_size``, i.e. ``n % (dp_size * group size) == 0``;
            otherwise a ``ValueError`` with the numbers. Every other guarantee is unchanged.
            The price: the shares are fixed before packing, so the count per rank can be higher
            and the slots less even than without it (see docs/benchmarks.md, step
            efficiency). Default False.
        use_dynamic_bsz_balance: order the slots for pipeline bubbles (light at both ends), as
            ``plan_micro_batches`` does. Default True; False: heaviest slot first.

    Returns:
        A :class:`DPSchedule`. Guarantees: the same count on every rank; every sample exactly
        once; every micro-batch ``<= max_token_len`` tokens and non-empty; groups never split;
        per rank the micro-batches tile ``rank_indices`` in order; the count a multiple of
        ``num_batches_divided_by`` and ``>= min_num_micro_batch``; with ``equal_samples`` the
        same sample count on every rank; deterministic. :meth:`DPSchedule.step_efficiency`
        reports how even the slots and the ranks are.

    Raises:
        ValueError: bad arguments; a sample or group over the cap; more micro-batches needed
            than there are groups (the message says which setting to change, and to what);
            ``equal_samples`` with unequal groups or a sample count not divisible by
            ``dp_size * group size``.

    Complexity: O(n log n) packing plus one or two capped-balancing passes (O(n t log t)), when
    ``t`` is above the bound ``dp_size`` more on ``n / dp_size`` groups each, and the slot
    evening (at most ``SLOT_PASSES * (4 g + 16 t / dp)`` vectorised steps, few in practice).
    About 50 ms for 1024 samples, 1-3 s for 16384 (mostly the capped balancing).

    Examples:
        24 tokens under a cap of 8 pack into 3 micro-batches; 2 ranks need a multiple of 2, so
        the count is rounded up to 4 (2 per rank) and one bin is split:

        >>> s = build_dp_schedule([6, 2, 5, 3, 4, 4], dp_size=2, max_token_len=8)
        >>> s.num_micro_batches, s.micro_batches, s.rank_indices
        (2, (((0,), (1, 4)), ((3, 5), (2,))), ((0, 1, 4), (3, 5, 2)))

        Slot 0 holds micro-batches of 6 and 8 tokens, slot 1 of 6 and 5: each slot pairs similar
        work. With ``equal_samples=True`` every rank gets 3 of the 6 samples:

        >>> [len(r) for r in build_dp_schedule([6, 2, 5, 3, 4, 4], 2, 8, equal_samples=True).rank_indices]
        [3, 3]
    """
    array = _lengths_array(lengths)
    dp_size = int_argument("dp_size", dp_size)  # Python ints: NumPy scalars would wrap (uint8) below
    max_token_len = int_argument("max_token_len", max_token_len)
    num_batches_divided_by = _optional_count("num_batches_divided_by", num_batches_divided_by)
    min_num_micro_batch = _optional_count("min_num_micro_batch", min_num_micro_batch)
    cost = as_cost_model(cost_model)
    groups = _groups(len(array), force_group_size, group_ids)
    for name, flag in (("equal_samples", equal_samples), ("use_dynamic_bsz_balance", use_dynamic_bsz_balance)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    if equal_samples:
        _check_equal_samples(len(array), groups, dp_size, force_group_size)
    measured = cost.rounded(array)  # what each sample counts for under the cost model
    check_int64_sums(measured)  # token totals; the default workloads are kept within int64 below
    work = balance_workloads(measured) if workload_fn is None else _workloads(measured, workload_fn)
    check_int64_sums(measured, work)

    capacity = cost.sample_capacity(max_token_len)
    under = "" if cost.is_default else f" under the {cost}"
    over = np.flatnonzero(measured > capacity)
    if over.size:
        index = int(over[0])
        raise ValueError(
            f"sample {index} has {int(array[index])} tokens{under}, which exceeds max_token_len={max_token_len} "
            f"({over.size} sample(s) over the cap, the largest has {int(array.max())}): raise max_token_len "
            f"to at least {int(measured.max())} or truncate those samples"
        )
    group_tokens = _part_sums(measured, groups)  # one NumPy pass each (exact: the guard above)
    group_work = _part_sums(work, groups)
    group_costs = group_tokens
    if cost.padded:  # a group costs its samples x its longest; only the padded route needs these
        group_sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
        group_longest = _group_maxima(measured, groups, group_sizes)
        group_costs = group_sizes * group_longest
    over = np.flatnonzero(group_costs > capacity)
    if over.size:
        index = int(over[0])
        kind = "forced group" if group_ids is None else "group"
        raise ValueError(
            f"{kind} exceeds max_token_len: group {index} (samples {groups[index]}) "
            f"{f'costs {int(group_costs[index])}{under}' if under else f'has {int(group_costs[index])} tokens'} "
            f"> max_token_len={max_token_len}; raise max_token_len "
            f"to at least {int(group_costs.max())} or use smaller groups"
        )
    capacity = max(capacity, 1)  # below the packed rounding only empty samples are left: any cap fits

    step = dp_size * (num_batches_divided_by or 1)
    floor = dp_size * (min_num_micro_batch or 1)
    if equal_samples:
        padded = (group_sizes, group_longest, _padded_model(workload_fn)) if cost.padded else None
        return _equal_samples_schedule(
            array, work, groups, group_tokens, group_work, capacity, dp_size, max_token_len,
            num_batches_divided_by or 1, min_num_micro_batch or 1, padded, use_dynamic_bsz_balance,
        )
    if cost.padded:
        return _padded_schedule(
            array, work, groups, group_sizes, group_longest, capacity, dp_size, step, floor, max_token_len,
            num_batches_divided_by, min_num_micro_batch, workload_fn, use_dynamic_bsz_balance,
        )
    packing = best_fit_decreasing_partitions(group_tokens, capacity)
    target = roundup_divisible(max(len(packing), floor), step)
    # A smaller multiple of ``step`` may still be feasible when the packer left slack: try the
    # counts from the packing lower bound up (usually none or one, since step >= dp_size).
    parts: Optional[list[list[int]]] = None
    bound = roundup_divisible(max(packing_lower_bound(group_tokens, capacity), floor), step)
    count = bound
    while count < target and count <= len(groups) and parts is None:
        parts = capped_balanced_partitions(group_tokens, group_work, capacity, count)
        if parts is None:
            count += step
    if parts is None and target <= len(groups):
        count = target
        parts = capped_balanced_partitions(group_tokens, group_work, capacity, count, feasible=packing)
    if (parts is None or count > bound) and dp_size > 1:
        # Not provably optimal: the per-rank route (split, then pack each share) is a candidate
        # too, so the schedule never needs more micro-batches per rank than that route.
        alternative = _per_rank_candidate(
            group_tokens, group_work, capacity, dp_size, num_batches_divided_by or 1, min_num_micro_batch or 1
        )
        if alternative is not None and (parts is None or len(alternative) < count):
            parts, count = alternative, len(alternative)
    if parts is None:
        raise _too_few_groups(
            target, len(packing), len(groups), dp_size, max_token_len, num_batches_divided_by, min_num_micro_batch
        )
    if parts is None or len(parts) != count:  # step 4 of capped_balanced_partitions guarantees this
        raise RuntimeError(f"internal error: no cap-respecting partition into {count} parts; please report")

    # Cut the micro-batches into slots of similar work, even out each slot with group moves and
    # swaps, then place each slot's micro-batches on ranks so that rank totals are even too.
    parts, grid = _aligned(parts, group_tokens, group_work, capacity, dp_size)
    if dp_size > 1 and count // dp_size <= FEW_SLOTS and len(groups) <= FEW_SLOTS_MAX_GROUPS:
        # With few slots each one weighs a lot, and the slot evening can stall a few millionths
        # short of the per-rank route (split first, pack each share): align that one as well
        # (cheap here) and keep whichever has the faster per-micro-batch step.
        alternative = _per_rank_candidate(
            group_tokens, group_work, capacity, dp_size, num_batches_divided_by or 1, min_num_micro_batch or 1
        )
        if alternative is not None and len(alternative) == count:
            other = _aligned(alternative, group_tokens, group_work, capacity, dp_size)
            if _slot_cost(other[0], other[1], group_work) < _slot_cost(parts, grid, group_work):
                parts, grid = other
    bin_work = _part_sums(group_work, parts)
    return _schedule_of(array, work, groups, parts, grid, bin_work, dp_size, max_token_len, use_dynamic_bsz_balance)


#: Up to this many micro-batches per rank, build_dp_schedule also aligns the per-rank route's
#: partition and keeps the better of the two (see :func:`build_dp_schedule`, step 3).
FEW_SLOTS = 16
#: ... and at most this many groups (the per-rank route costs ``dp_size`` capped searches).
FEW_SLOTS_MAX_GROUPS = 4096


def _aligned(
    parts: list[list[int]], tokens: np.ndarray, work: np.ndarray, capacity: int, dp_size: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Steps 4-6 of :func:`build_dp_schedule` on one partition: slots, evening, ranks, polish."""
    parts = sorted(sorted(part) for part in parts)  # deterministic, independent of the partitioner
    slots = _slots_from_bins(parts, _part_sums(work, parts), dp_size)
    parts = _even_slots(parts, slots, tokens, work, capacity, moves=True)
    grid = _ranks_within_slots(slots, _part_sums(work, parts), dp_size)
    parts = _polish_ranks(parts, grid, tokens, work, capacity, moves=True)
    return parts, grid


def _slot_cost(parts: list[list[int]], grid: list[list[int]], work: np.ndarray) -> tuple[int, int]:
    """(sum over slots of the heaviest bin, heaviest rank total): the two step times, in order."""
    cells = _part_sums(work, parts)[np.asarray(grid, dtype=np.int64)]
    return int(cells.max(axis=1).sum()), int(cells.sum(axis=0).max())


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
    pipeline: bool,
) -> DPSchedule:
    """The DPSchedule of micro-batches ``parts`` (group indices) laid out as ``grid``
    (``grid[s][r]``: the part rank ``r`` runs in slot ``s``), slots in :func:`_slot_order`."""
    micro = [sorted(i for g in part for i in groups[g]) for part in parts]
    order = _slot_order(grid, bin_work, pipeline)
    per_rank = [tuple(tuple(micro[grid[s][r]]) for s in order) for r in range(dp_size)]
    per_rank.sort(key=lambda r: min(mb[0] for mb in r))  # rank 0 holds sample 0: stable across ties
    return DPSchedule(
        dp_size=dp_size,
        max_token_len=max_token_len,
        num_micro_batches=len(parts) // dp_size,
        micro_batches=tuple(per_rank),
        rank_indices=tuple(tuple(i for mb in r for i in mb) for r in per_rank),
        lengths=tuple(array.tolist()),
        workloads=tuple(work.tolist()),
    )


def _padded_schedule(
    array: np.ndarray,
    work: np.ndarray,
    groups: list[list[int]],
    group_sizes: np.ndarray,
    group_longest: np.ndarray,
    capacity: int,
    dp_size: int,
    step: int,
    floor: int,
    max_token_len: int,
    num_batches_divided_by: Optional[int],
    min_num_micro_batch: Optional[int],
    workload_fn: Optional[WorkloadFn],
    pipeline: bool,
) -> DPSchedule:
    """build_dp_schedule under the padded cost: runs of the length-sorted groups, then slots.

    No group moves between micro-batches here (a move could break the padded cap), so slots
    are the sorted micro-batches cut in ``dp_size`` and the ranks are placed within them."""
    fewest = padded_min_count(group_longest, group_sizes, capacity)
    count = roundup_divisible(max(fewest, floor), step)
    if count > len(groups):
        raise _too_few_groups(count, fewest, len(groups), dp_size, max_token_len, num_batches_divided_by, min_num_micro_batch)
    model = _padded_model(workload_fn)
    parts = padded_partitions(group_longest, group_sizes, capacity, count, workload_fn=model)
    if parts is None or len(parts) != count:  # padded_partitions succeeds from the greedy count up
        raise RuntimeError(f"internal error: no padded partition into {count} parts; please report")
    parts = sorted(parts)
    bin_work = _padded_work(parts, group_sizes, group_longest, model)
    grid = _ranks_within_slots(_slots_from_bins(parts, bin_work, dp_size), bin_work, dp_size)
    return _schedule_of(array, work, groups, parts, grid, bin_work, dp_size, max_token_len, pipeline)


def _padded_model(workload_fn: Optional[WorkloadFn]) -> Callable[[np.ndarray], np.ndarray]:
    return (lambda lengths: _workloads(lengths, workload_fn)) if workload_fn is not None else balance_workloads


def _padded_work(
    parts: list[list[int]], group_sizes: np.ndarray, group_longest: np.ndarray, model: Callable[[np.ndarray], np.ndarray]
) -> list[int]:
    """Padded workload of every part: its samples x the workload of its longest sample."""
    longest = np.array([int(group_longest[part].max()) for part in parts], dtype=np.int64)
    return [int(group_sizes[part].sum()) * int(w) for part, w in zip(parts, model(longest))]


def _check_equal_samples(n: int, groups: list[list[int]], dp_size: int, force_group_size: int) -> None:
    """``equal_samples=True`` needs groups of one size whose count divides by ``dp_size``."""
    sizes = sorted({len(group) for group in groups})
    if len(sizes) > 1:
        first = next(i for i, group in enumerate(groups) if len(group) != len(groups[0]))
        raise ValueError(
            f"equal_samples=True needs groups of one size, but group 0 has {len(groups[0])} samples and group "
            f"{first} has {len(groups[first])} (sizes {sizes}): make every uid group the same size or pass "
            f"equal_samples=False"
        )
    if len(groups) % dp_size:
        size = sizes[0]
        what = f"dp_size = {dp_size}" if size == 1 else f"dp_size * group size = {dp_size} * {size} = {dp_size * size}"
        raise ValueError(
            f"equal_samples=True: {n} samples cannot be split evenly over dp_size={dp_size} ranks "
            f"({n} % ({what}) = {n % (dp_size * size)}): pass a batch whose sample count is a multiple of "
            f"{dp_size * size}, or equal_samples=False"
        )


def _equal_samples_schedule(
    array: np.ndarray,
    work: np.ndarray,
    groups: list[list[int]],
    group_tokens: np.ndarray,
    group_work: np.ndarray,
    capacity: int,
    dp_size: int,
    max_token_len: int,
    divisor: int,
    min_count: int,
    padded: Optional[tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], np.ndarray]]],
    pipeline: bool,
) -> DPSchedule:
    """build_dp_schedule with ``equal_samples=True``: split, then pack each share, then align.

    The groups (all of one size) are split over the ranks first, equal group counts balanced on
    workload by KK (what verl's equal-chunk dispatch of a balanced batch gives); each share is
    packed at the count every rank needs (the largest of the shares' smallest feasible counts,
    the others split up to it); each rank's micro-batches are sorted by workload and slot ``i``
    takes the ``i``-th of every rank, then swaps of one group for one between a slot's
    micro-batches even it out (a swap keeps both ranks' sample counts). ``padded`` is
    ``(group_sizes, group_longest, model)`` under the padded cost, where no group moves."""
    shares = [np.asarray(sorted(share), dtype=np.int64) for share in karmarkar_karp(group_work, dp_size, equal_size=True)]
    per_share = len(shares[0])

    def too_few(needed: int) -> ValueError:
        return ValueError(
            f"Cannot satisfy max_token_len={max_token_len} with equal_samples=True: every rank needs {needed} "
            f"micro-batches (to respect the cap, a multiple of num_batches_divided_by={divisor}, at least "
            f"min_num_micro_batch={min_count}) but each rank's share has only {per_share} group(s); raise "
            f"max_token_len, lower num_batches_divided_by or min_num_micro_batch, use a smaller dp_size, or "
            f"pass equal_samples=False"
        )

    if padded is not None:
        sizes, longest, model = padded
        fewest = max(padded_min_count(longest[share], sizes[share], capacity) for share in shares)
        count = roundup_divisible(max(fewest, min_count), divisor)
        if count > per_share:
            raise too_few(count)
        plans = [padded_partitions(longest[share], sizes[share], capacity, count, workload_fn=model) for share in shares]
        if any(plan is None or len(plan) != count for plan in plans):
            raise RuntimeError(f"internal error: no padded partition into {count} parts; please report")
    else:
        searched = [
            smallest_feasible_partitions(group_tokens[share], group_work[share], capacity, min_count=min_count, step=divisor)
            for share in shares
        ]
        count = max(k for k, _ in searched)
        if count > per_share or any(plan is None for _, plan in searched):
            raise too_few(count)
        plans = [
            plan if k == count else capped_balanced_partitions(group_tokens[share], group_work[share], capacity, count, feasible=plan)
            for share, (k, plan) in zip(shares, searched)
        ]
        if any(plan is None or len(plan) != count for plan in plans):  # feasible= makes this succeed
            raise RuntimeError(f"internal error: no cap-respecting partition into {count} parts; please report")
    rank_parts = [sorted(sorted(int(share[i]) for i in part) for part in plan) for share, plan in zip(shares, plans)]
    parts = [part for plan in rank_parts for part in plan]

    def weigh(parts: list[list[int]]) -> list[int]:
        return _padded_work(parts, *padded) if padded is not None else _part_sums(group_work, parts).tolist()

    bin_work = weigh(parts)
    columns = []
    for rank in range(dp_size):
        own = range(rank * count, (rank + 1) * count)
        columns.append(sorted(own, key=lambda b: (-bin_work[b], parts[b][0])))
    grid = [[columns[r][s] for r in range(dp_size)] for s in range(count)]
    if padded is None:
        parts = _even_slots(parts, grid, group_tokens, group_work, capacity, moves=False)
        parts = _polish_ranks(parts, grid, group_tokens, group_work, capacity, moves=False)
        bin_work = weigh(parts)
    return _schedule_of(array, work, groups, parts, grid, bin_work, dp_size, max_token_len, pipeline)


# ---------------------------------------------------------------------------------------------
# Balancing a batch over ranks (the driver-side split, no micro-batching)
# ---------------------------------------------------------------------------------------------


def balance_batch(
    lengths: Sequence[int],
    dp_size: int,
    *,
    equal_size: bool = True,
    group_ids: Optional[Sequence[Hashable]] = None,
    workload_fn: Optional[WorkloadFn] = None,
) -> tuple[list[list[int]], dict[str, Any]]:
    """Split a batch over ``dp_size`` ranks with balanced workload (KK), groups kept together.

    Args:
        lengths: effective tokens of each sample.
        dp_size: number of ranks, >= 1.
        equal_size: every rank gets the same number of samples (of groups, with ``group_ids``).
            Default True, as verl's trainer balance does.
        group_ids: one hashable per sample; equal ids go to the same rank (the n responses of one
            GRPO prompt). Default None: every sample is its own group.
        workload_fn: lengths -> workloads (default :func:`seqbal.calculate_workload`).

    Returns:
        ``(partitions, metrics)``: ``dp_size`` ascending index lists (in descending order of
        workload), and :func:`seqbal.log_seqlen_unbalance` of the token counts with prefix
        ``global_seqlen`` (contiguous equal slices "before", these partitions "balanced").

    Raises:
        ValueError: bad arguments, fewer groups than ranks, or ``equal_size`` with a group count
            not divisible by ``dp_size`` (the message gives the numbers).

    Complexity: O(n + g dp log dp) for g groups.

    Examples:
        >>> parts, metrics = balance_batch([8, 7, 1, 2], dp_size=2)
        >>> parts, metrics["global_seqlen/max"], metrics["global_seqlen/balanced_max"]
        ([[0, 2], [1, 3]], 15, 9)
    """
    array = _lengths_array(lengths)
    dp_size = int_argument("dp_size", dp_size)
    groups = _groups(len(array), 1, group_ids)
    work = _workloads(array, workload_fn)
    what = "uid groups" if group_ids is not None else "samples"
    if len(groups) < dp_size:
        raise ValueError(f"{len(groups)} {what} cannot be split over dp_size={dp_size} ranks: need at least {dp_size}")
    if equal_size and len(groups) % dp_size:
        raise ValueError(
            f"{len(groups)} {what} cannot be split evenly over dp_size={dp_size} ranks "
            f"({len(groups)} % {dp_size} = {len(groups) % dp_size}): pass equal_size=False or a batch whose "
            f"number of {what} is a multiple of dp_size"
        )
    group_work = np.array([int(work[g].sum()) for g in groups], dtype=np.int64)
    group_parts = karmarkar_karp(group_work, dp_size, equal_size=equal_size)
    partitions = [sorted(i for g in part for i in groups[g]) for part in group_parts]
    return partitions, log_seqlen_unbalance(array.tolist(), partitions, prefix="global_seqlen")


def get_group_balanced_partitions(
    seqlen_list: Sequence[int], uid_list: Sequence[Hashable], k_partitions: int
) -> list[list[int]]:
    """Split samples over ``k_partitions`` ranks, samples with the same uid kept together.

    A thin wrapper of :func:`balance_batch` with ``equal_size=True``: groups are formed by uid
    value (they need not be contiguous) and each partition gets the same number of groups,
    balanced on workload with KK, as verl does for ``rollout.n`` responses per prompt.

    Complexity: O(n + g k log k) for g groups.

    Raises:
        ValueError: lengths and uids of different sizes, fewer groups than partitions, or a
            group count not divisible by ``k_partitions``.

    Examples:
        >>> get_group_balanced_partitions([5, 5, 1, 1], ["a", "a", "b", "b"], 2)
        [[0, 1], [2, 3]]
    """
    seqlen_list = int_array(seqlen_list, "seqlen_list", sums=False)  # before len(): a 0-d array has none
    if len(seqlen_list) != len(uid_list):
        raise ValueError(f"seqlen_list has {len(seqlen_list)} entries but uid_list has {len(uid_list)}")
    return balance_batch(seqlen_list, k_partitions, equal_size=True, group_ids=uid_list)[0]
