"""The local decision: what one rank can decide about its own lengths, with no collective.

:class:`_LocalPlan` holds one rank's groups under the cap and partitions them into a given
count; :func:`_local_stage` reads the lengths, finds the local problem (if any) and the count
this rank proposes; :func:`_try_partition` and :func:`_finish` turn the agreed count into index
lists. With ``dummy_micro_batches=True`` in sync mode, a rank with fewer groups than the agreed
count is not an error: it partitions its groups one per part and returns empty index lists for
the rest (the caller fills them with copies of a sample, see
:func:`~seqbal.plan.pipeline.dummy_source`). Needs only NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..cost import CostModel, padded_min_count, padded_partitions
from ..partition import (
    capped_balanced_partitions,
    exact as _small_exact,
    packing_lower_bound,
    roundup_divisible,
    sample_cap as _sample_cap,
    split_bins_to_count,
    windows as _windows,
)
from ..partition.search import _smallest_feasible
from ..validation import check_int64_sums
from ..order import ranked
from ..partition.bins import _sums
from ..workload import WorkloadFn, balance_workloads, checked_workloads
from .arguments import _Arguments, _lengths_array, _validate_arguments
from .errors import LengthsLike, MicroBatchPlanError
from .pipeline import _pipeline_order, order_for_pipeline


@dataclass
class _LocalPlan:
    """What one rank decides from its own lengths before any agreement.

    Under the token cost, ``group_tokens`` are the (rounded) tokens of each forced group and
    a part fits when their sum is ``<= capacity`` (the cap, lowered to a multiple of the packed
    rounding). Under the padded cost, a part fits when ``samples x its longest`` is
    ``<= capacity``; ``group_longest`` holds each group's longest (rounded) sample.
    """

    group_tokens: np.ndarray  # tokens per forced group, after per-sequence rounding
    group_workloads: np.ndarray  # workload per forced group (token cost only)
    group_longest: np.ndarray  # longest sample per forced group, after rounding
    group_size: int
    capacity: int  # what a part's cost is compared with
    cost_model: CostModel
    count: int  # smallest count (>= min, multiple of step) at which this rank meets the cap
    parts: list[list[int]]  # a cap-respecting partition of the groups into ``count`` parts
    # Padded cost of micro-batches trimmed to their window (trim_padding): each group's first
    # and last-plus-one columns (seqbal.partition.windows); ``group_longest`` then holds their widths.
    windows: Optional[tuple[np.ndarray, np.ndarray]] = None
    # Workload per sample under the token cost (what ``group_workloads`` sums), for the
    # pipeline order; None under the padded cost.
    sample_workloads: Optional[np.ndarray] = None
    # Most groups a part may hold: max_samples_per_micro_batch // group_size; None: no cap.
    group_cap: Optional[int] = None
    # lengths -> int64 workloads: the default model, or the caller's workload_fn checked
    # (what the padded partitioner and the pipeline order weigh a longest sample with)
    workload_model: Callable[[np.ndarray], np.ndarray] = balance_workloads

    @property
    def num_groups(self) -> int:
        return len(self.group_tokens)

    def partition_at(self, count: int) -> Optional[list[list[int]]]:
        """Cap-respecting partition of the groups into ``count`` parts; None if none was found."""
        if count == self.count:
            return self.parts
        if self.windows is not None:
            candidate = self._windowed_partition(count, self.parts)
        elif self.cost_model.padded:
            candidate = padded_partitions(self.group_longest, self.group_size, self.capacity, count,
                                          workload_fn=self.workload_model)
        else:
            candidate = capped_balanced_partitions(
                self.group_tokens, self.group_workloads, self.capacity, count, feasible=self.parts
            )
        if self.group_cap is None:
            return candidate
        return self._sample_capped_at(count, candidate)

    def _sample_capped_at(self, count: int, candidate: Optional[list[list[int]]]) -> Optional[list[list[int]]]:
        """``candidate`` (a partition into ``count`` parts within the cost cap) made to meet the
        sample cap at the same count, else a count-weighted balance from this rank's own
        partition repaired, else that partition (both caps, ``self.count`` parts) split up to
        ``count``: :func:`seqbal.partition.sample_cap.raised_within_caps`, which keeps both caps
        for any count from this rank's up to its groups (why any of them can be agreed). The
        repairs and the balance need the token cost (``capacity`` None under the padded or
        windowed cost); the balance weighs counts as :func:`_meet_sample_cap` does."""
        capacity = None if self.cost_model.padded or self.windows is not None else self.capacity
        ones = np.ones(self.num_groups, dtype=np.int64)
        return _sample_cap.raised_within_caps(
            self.parts, count, self.group_tokens, ones, capacity, self.group_cap,
            balance_work=_sample_cap.with_count_weight(self.group_workloads), candidate=candidate,
        )

    def part_cost(self, part: Sequence[int]) -> int:
        """What a non-empty part of groups costs against the cap (the cost model's measure). O(len(part))."""
        if self.windows is not None:
            starts, stops = self.windows
            return _windows.window_cost(part, starts, stops, self.group_size, self.cost_model.round_to)
        if self.cost_model.padded:
            return len(part) * self.group_size * int(self.group_longest[part].max())
        return int(self.group_tokens[part].sum())

    def fits(self, part: Sequence[int]) -> bool:
        """Whether a non-empty part of groups costs at most the cap under the cost model (and
        holds at most ``group_cap`` groups, where the sample cap is given)."""
        if not len(part):
            return False
        if self.group_cap is not None and len(part) > self.group_cap:
            return False  # the sample cap, whatever the cost model
        if self.windows is not None:
            starts, stops = self.windows
            return _windows.window_cost(part, starts, stops, self.group_size, self.cost_model.round_to) <= self.capacity
        if self.cost_model.padded:
            return len(part) * self.group_size * int(self.group_longest[part].max()) <= self.capacity
        return int(self.group_tokens[part].sum()) <= self.capacity

    def _windowed_partition(self, count: int, known: Optional[list[list[int]]]) -> Optional[list[list[int]]]:
        """``count`` parts whose trimmed windows fit: the padded partition on the groups' own
        widths, over-cap parts cut (``seqbal.partition.windows``); where that gives more than ``count``
        parts, ``known`` (a feasible partition with fewer) split up to ``count``."""
        starts, stops = self.windows
        g, round_to = self.group_size, self.cost_model.round_to
        candidate = padded_partitions(self.group_longest, g, self.capacity, count, workload_fn=self.workload_model)
        if candidate is not None:
            candidate = _windows.fit_to_cap(candidate, starts, stops, g, round_to, self.capacity)
        if (candidate is None or len(candidate) > count) and known is not None:
            candidate = known
        if candidate is None:
            return None
        return _windows.split_to_count(candidate, starts, stops, g, round_to, count)

    def samples_of(self, group_parts: list[list[int]]) -> list[list[int]]:
        g = self.group_size
        if g == 1:
            return [sorted(part) for part in group_parts]
        return [sorted(chain.from_iterable(range(i * g, i * g + g) for i in part)) for part in group_parts]


def _cost_note(cost_model: CostModel, measured: int, tokens: int) -> str:
    """What a sample's length becomes under a cost model other than effective tokens: nothing
    for the default, `` under the <model>``, or `` (M after rounding, under the <model>)``."""
    if cost_model.is_default:
        return ""
    if cost_model.memory is not None:
        return f" (predicted {cost_model.cost([tokens])} bytes, under the {cost_model})"
    if measured == tokens:
        return f" under the {cost_model}"
    return f" ({measured} after rounding, under the {cost_model})"


def _local_plan(
    lengths: np.ndarray,
    max_token_len: int,
    num_batches_divided_by: Optional[int],
    min_num_micro_batch: Optional[int],
    force_group_size: int,
    cost_model: CostModel = CostModel(),
    windows: Optional[tuple[np.ndarray, np.ndarray]] = None,
    short_ok: bool = False,
    max_samples: Optional[int] = None,
    workload_fn: Optional[WorkloadFn] = None,
) -> _LocalPlan:
    """This rank's smallest feasible count and a partition at it.

    With ``max_samples`` (``max_samples_per_micro_batch``) a part holds at most
    ``max_samples // force_group_size`` groups: the count starts at that bound
    (:func:`seqbal.partition.sample_cap.sample_count_bound`) and every partition is made to
    meet it (:func:`_meet_sample_cap`).

    With ``short_ok`` (synced dummy micro-batches) a count above the number of groups is not
    an error: the plan keeps it as this rank's proposal and one group per part as its
    partition; the agreement then fills the missing parts with dummies.

    ``workload_fn`` (lengths -> workloads, checked by :func:`seqbal.workload.checked_workloads`)
    is what the partitions balance; None: the default model.
    """
    model = balance_workloads if workload_fn is None else _checked_model(workload_fn)
    n = len(lengths)
    if n % force_group_size:
        raise MicroBatchPlanError(
            f"force_group_size={force_group_size} does not divide the batch size {n}", MicroBatchPlanError.BAD_BATCH
        )
    g = force_group_size
    if max_samples is not None and g > max_samples:
        raise MicroBatchPlanError(
            f"forced group of {g} samples exceeds max_samples_per_micro_batch={max_samples}: samples i*{g} .. "
            f"i*{g}+{g - 1} must share a micro-batch, which may hold only {max_samples}; raise "
            f"max_samples_per_micro_batch to at least {g} or lower force_group_size",
            MicroBatchPlanError.GROUP_EXCEEDS_SAMPLES,
        )
    group_cap = None if max_samples is None else max_samples // g
    windows = windows if cost_model.padded else None  # only a padded forward pays for the window
    if windows is not None:
        # Trimmed, a sample costs the width of its window (first to last token), not its count.
        starts, stops = (np.asarray(w, dtype=np.int64) for w in windows)
        measured = cost_model.rounded(np.maximum(stops - starts, 0))
    else:
        measured = cost_model.sample_costs(lengths)  # rounded lengths, or bytes under a memory cost
    sample_capacity = cost_model.sample_capacity(max_token_len)
    over = np.flatnonzero(measured > sample_capacity)
    if over.size:
        index = int(over[0])
        note = (
            f" spread over a window of {int(np.maximum(stops - starts, 0)[index])} columns (trim_padding keeps its "
            f"first to last token), costing {int(measured[index])} under the {cost_model}"
            if windows is not None
            else _cost_note(cost_model, int(measured[index]), int(lengths[index]))
        )
        raise MicroBatchPlanError(
            f"sample {index} has {int(lengths[index])} tokens{note}, which exceeds "
            f"max_token_len={max_token_len} ({over.size} sample(s) over the cap; the largest has "
            f"{int(lengths.max())} tokens)",
            MicroBatchPlanError.SAMPLE_EXCEEDS,
        )
    try:  # before any sum: token totals must not wrap around in int64 (workloads cannot, see below)
        check_int64_sums(measured)
    except ValueError as error:
        raise MicroBatchPlanError(str(error), MicroBatchPlanError.BAD_BATCH) from None
    group_tokens = measured.reshape(-1, g).sum(axis=1)
    group_longest = measured.reshape(-1, g).max(axis=1)
    group_costs = cost_model.group_costs(lengths, g)
    if windows is not None:
        windows = (starts.reshape(-1, g).min(axis=1), stops.reshape(-1, g).max(axis=1))
        group_longest = cost_model.rounded(np.maximum(windows[1] - windows[0], 0))
        group_costs = g * group_longest
    if workload_fn is not None and cost_model.padded:
        # The padded partitioner weighs groups' longest samples (window widths): check the model on
        # all of them here, before any agreement, so that no later call on a subset can fail.
        model(group_longest)
    over = np.flatnonzero(group_costs > max_token_len)
    if over.size:
        index = int(over[0])
        cost = "" if cost_model.is_default else f", costing {int(group_costs[index])} under the {cost_model}"
        raise MicroBatchPlanError(
            f"forced group exceeds max_token_len: group {index} (samples {index * g}..{index * g + g - 1}, "
            f"force_group_size={g}) has {int(lengths.reshape(-1, g)[index].sum())} tokens{cost} > "
            f"max_token_len={max_token_len}",
            MicroBatchPlanError.FORCED_GROUP_EXCEEDS,
        )
    step = num_batches_divided_by or 1
    min_count = min_num_micro_batch or 1
    if group_cap is not None:  # no partition has fewer parts: the count search starts there
        min_count = max(min_count, _sample_cap.sample_count_bound(np.ones(len(group_tokens), dtype=np.int64), group_cap))
    sample_workloads = None  # set under the token cost, below
    # A cap below the packed rounding leaves room only for empty samples (checked above), which
    # fit any positive capacity: the partitioner needs one.
    sample_capacity = max(sample_capacity, 1)
    if windows is not None:
        group_workloads = np.zeros(0, dtype=np.int64)
        plan = _LocalPlan(group_tokens, group_workloads, group_longest, g, max_token_len, cost_model, 0, [], windows,
                          workload_model=model)
        # The least count on the groups' own widths, then what cutting the over-cap parts needs.
        least = max(min_count, padded_min_count(group_longest, g, max_token_len))
        parts = (padded_partitions(group_longest, g, max_token_len, least, workload_fn=model)
                 if least <= len(group_longest) else None)
        if parts is None:
            count = roundup_divisible(least, step)
        else:
            parts = _windows.fit_to_cap(parts, *windows, g, cost_model.round_to, max_token_len)
            count = roundup_divisible(max(min_count, len(parts)), step)
            parts = plan._windowed_partition(count, parts) if count <= len(group_longest) else None
    elif cost_model.padded:
        group_workloads = np.zeros(0, dtype=np.int64)  # the padded partitioner weighs runs itself
        count = roundup_divisible(max(min_count, padded_min_count(group_longest, g, max_token_len)), step)
        parts = (padded_partitions(group_longest, g, max_token_len, count, workload_fn=model)
                 if count <= len(group_longest) else None)
        if group_cap is not None and parts is not None:
            count, parts = _padded_within_samples(parts, count, group_longest, g, max_token_len, group_cap, min_count, step)
    else:
        # exact where int64 fits; a memory cost still balances compute, on the (rounded) lengths
        sample_workloads = model(measured if cost_model.memory is None else cost_model.rounded(lengths))
        group_workloads = sample_workloads.reshape(-1, g).sum(axis=1)
        count, parts = _smallest_feasible(group_tokens, group_workloads, sample_capacity, min_count, step)
        # Under the sample cap the exact search's lower multiple would ignore it: not tried.
        if step > 1 and parts is not None and group_cap is None:
            count, parts = _one_multiple_lower(group_tokens, group_workloads, sample_capacity, count, parts, min_count, step)
    if group_cap is not None and parts is not None:
        capacity = None if cost_model.padded else sample_capacity
        count, parts = _meet_sample_cap(parts, count, group_tokens, group_workloads, capacity, group_cap, min_count, step)
    if parts is None and short_ok:
        parts = [[group] for group in range(len(group_tokens))]
    if parts is None:
        model = "" if cost_model.is_default else f" under the {cost_model}"
        raise MicroBatchPlanError(
            f"Cannot satisfy max_token_len={max_token_len}{model}: {int(lengths.sum())} tokens in "
            f"{len(group_tokens)} group(s) of {g} sample(s) need at least {count} micro-batches "
            f"(min_num_micro_batch={min_num_micro_batch}, num_batches_divided_by={num_batches_divided_by}"
            + ("" if max_samples is None else f", max_samples_per_micro_batch={max_samples}")
            + "), "
            f"but only {len(group_tokens)} non-empty micro-batches can be formed; raise max_token_len, "
            f"lower min_num_micro_batch or num_batches_divided_by, or give this rank more samples",
            MicroBatchPlanError.CANNOT_SATISFY,
        )
    return _LocalPlan(
        group_tokens, group_workloads, group_longest, g, sample_capacity, cost_model, count, parts, windows,
        sample_workloads, group_cap, model,
    )


def _checked_model(workload_fn: WorkloadFn) -> Callable[[np.ndarray], np.ndarray]:
    """``workload_fn`` checked (:func:`seqbal.workload.checked_workloads`), its errors this rank's
    :class:`MicroBatchPlanError` (an invalid argument, agreed like any other)."""

    def model(values: np.ndarray) -> np.ndarray:
        try:
            return checked_workloads(values, workload_fn)
        except ValueError as error:
            raise MicroBatchPlanError(str(error), MicroBatchPlanError.BAD_ARGUMENT) from None

    return model


#: Counts the sample repair tries after the token search's partition failed it, from that
#: count up: each a balance on workloads that weigh the groups' count too
#: (:func:`seqbal.partition.sample_cap.with_count_weight`) and a repair, before the over-full
#: parts are peeled or split (trades a balance pass per try against the parts a split adds).
SAMPLE_CAP_TRIES = 3


def _meet_sample_cap(
    parts: list[list[int]],
    count: int,
    group_tokens: np.ndarray,
    group_workloads: np.ndarray,
    capacity: Optional[int],
    group_cap: int,
    min_count: int,
    step: int,
) -> tuple[int, Optional[list[list[int]]]]:
    """``(count, parts)`` made to hold at most ``group_cap`` groups per part.

    Under the token cost (``capacity`` given): the search's partition repaired at its count
    (where the cap does not bind nothing moves, and the plan is the plain one); else, at
    :data:`SAMPLE_CAP_TRIES` counts from it up, the snake deal where it meets both caps, or a
    balance on count-weighted workloads, repaired.
    Then, and under the padded cost at once, the over-full parts peeled or split
    (:mod:`seqbal.partition.sample_cap`) and the count raised to the next allowed one by
    splitting further (:func:`split_bins_to_count`). Splitting never breaks a cap, so the
    result meets both; ``(count, None)`` where the count exceeds the groups."""
    ones = np.ones(len(group_tokens), dtype=np.int64)
    repaired = parts
    if capacity is not None:
        repaired, fixed = _sample_cap.repair_sample_cap(parts, group_tokens, ones, capacity, group_cap)
        if fixed:
            return count, repaired
        counted = _sample_cap.with_count_weight(group_workloads)
        for tried in range(count, min(count + SAMPLE_CAP_TRIES * step, len(group_tokens) + 1), step):
            dealt = _sample_cap.dealt_within_caps(group_tokens, ones, capacity, group_cap, tried)
            if dealt is not None:
                return tried, dealt
            balanced = capped_balanced_partitions(group_tokens, counted, capacity, tried, feasible=parts)
            if balanced is None:
                continue
            again, fixed = _sample_cap.repair_sample_cap(balanced, group_tokens, ones, capacity, group_cap)
            if fixed:
                return tried, again
    # The search's partition as far as the repair got it (never over the token cap), peeled or split.
    pieces = _sample_cap.capped_pieces(repaired, group_tokens, ones, capacity, group_cap, repaired=True)
    count = roundup_divisible(max(min_count, len(pieces)), step)
    if count > len(group_tokens):
        return count, None
    return count, split_bins_to_count(pieces, group_tokens, count)


def _padded_within_samples(
    parts: list[list[int]], count: int, group_longest: np.ndarray, g: int, capacity: int, group_cap: int,
    min_count: int, step: int,
) -> tuple[int, Optional[list[list[int]]]]:
    """``(count, parts)``: the padded partition at ``count`` where it already holds at most ``group_cap`` groups
    per part (the plan is then the plain one); else the fewer of its parts split to the cap
    and the runs under both caps (:func:`seqbal.partition.sample_cap.padded_runs`, the fewest
    there are for groups of one size), raised to the next allowed count by splitting (a piece's
    padded cost is at most its part's). ``(count, None)`` where that count exceeds the groups."""
    ones = np.ones(len(group_longest), dtype=np.int64)
    split = _sample_cap.split_to_sample_cap(parts, ones, group_cap)
    if len(split) == count:
        return count, split
    runs = _sample_cap.padded_runs(group_longest, np.full(len(group_longest), g, dtype=np.int64), capacity, group_cap * g)
    best = runs if len(runs) < len(split) else split
    target = roundup_divisible(max(min_count, len(best)), step)
    if target > len(group_longest):
        return target, None
    if target > len(runs) and len(best) == len(runs):
        # room to balance: the padded partitioner at the target, if it keeps the sample cap
        balanced = padded_partitions(group_longest, g, capacity, target)
        if balanced is not None and _sample_cap.within_sample_cap(balanced, ones, group_cap):
            return target, balanced
    return target, split_bins_to_count(best, group_longest, target)


def _one_multiple_lower(
    tokens: np.ndarray,
    workloads: np.ndarray,
    capacity: int,
    count: int,
    parts: list[list[int]],
    min_count: int,
    step: int,
) -> tuple[int, list[list[int]]]:
    """``(count, parts)``, or one multiple of ``step`` lower where a few groups fit in it.

    Rounding to a multiple of ``num_batches_divided_by`` turns a count the search's tries miss
    into a whole multiple more. On a few groups (``seqbal.partition.exact.MAX_ITEMS``), when the
    multiple below is not below the packing bound, a budgeted exact search looks for it, and the
    partition it finds is balanced by :func:`capped_balanced_partitions`. Costs nothing with
    ``step == 1``, on larger batches, or at the bound.
    """
    lower = count - step
    if len(tokens) > _small_exact.MAX_ITEMS or lower < max(min_count, packing_lower_bound(tokens, capacity)):
        return count, parts
    found = _small_exact.exact_fit(tokens, capacity, lower)
    if found is None:
        return count, parts
    balanced = capped_balanced_partitions(tokens, workloads, capacity, lower, feasible=found)
    return lower, balanced if balanced is not None else found

@dataclass(frozen=True)
class _WindowedLengths:
    """Effective lengths of a batch whose micro-batches will be trimmed to their padding window
    (``rearrange_micro_batches(..., trim_padding=True)``), with each sample's first column and
    last column + 1 (``(width, 0)`` for a sample without tokens): under the padded cost a
    trimmed micro-batch costs ``samples x`` the union of its samples' windows."""

    lengths: Any
    starts: np.ndarray
    stops: np.ndarray


@dataclass
class _LocalStage:
    """One rank's outcome before any agreement: a plan, or the error it must report."""

    plan: Optional[_LocalPlan]
    lengths: Optional[np.ndarray]
    problem: Optional[Exception]
    code: int  # MicroBatchPlanError code of ``problem``, 0 without one
    arguments: Optional[_Arguments] = None  # None when the arguments themselves are invalid


def _local_stage(
    get_lengths: Callable[[], LengthsLike],
    raw_arguments: dict[str, Any],
    *,
    capture_unexpected: bool,
    synced: bool = False,
) -> _LocalStage:
    """Validate and plan on this rank's own data, capturing the error instead of raising it.

    ``raw_arguments``: the caller's arguments as given, by the names of
    :func:`~seqbal.plan.arguments._validate_arguments` (checked here, inside the capture, so
    that a bad one is this rank's error in the agreement). With ``capture_unexpected`` (sync
    mode) any exception is captured, not only ours: an unexpected one must still reach the
    agreement, or the peers would hang. With ``synced`` and ``dummy_micro_batches``, a count
    above this rank's groups is left to the dummies.
    """
    arguments = None
    try:
        validated = _validate_arguments(**raw_arguments)
        # the ranks compare the model's digest in the agreement; a model that fails on the probe
        # leaves this rank without valid arguments, as any other invalid one does
        arguments = validated.with_digest() if synced else validated
        measured = get_lengths()
        windows = None
        if isinstance(measured, _WindowedLengths):
            measured, windows = measured.lengths, (measured.starts, measured.stops)
        try:
            lengths = _lengths_array(measured)
        except MicroBatchPlanError as error:
            if error.code != MicroBatchPlanError.EMPTY_BATCH or not arguments.dummy_micro_batches:
                raise
            raise MicroBatchPlanError(
                f"{error}; dummy_micro_batches=True cannot help: a dummy is a copy of one of the rank's own "
                f"samples, and this rank has none (give every rank at least one sample)",
                error.code,
            ) from None
        plan = _local_plan(
            lengths,
            arguments.max_token_len,
            arguments.num_batches_divided_by,
            arguments.min_num_micro_batch,
            arguments.force_group_size,
            arguments.cost_model,
            windows,
            short_ok=synced and arguments.dummy_micro_batches,
            max_samples=arguments.max_samples_per_micro_batch,
            workload_fn=arguments.workload_fn,
        )
        return _LocalStage(plan, lengths, None, 0, arguments)
    except MicroBatchPlanError as error:
        return _LocalStage(None, None, error, error.code, arguments)
    except Exception as error:  # noqa: BLE001
        if not capture_unexpected:
            raise
        wrapped = MicroBatchPlanError(
            f"the batch could not be read: {type(error).__name__}: {error}", MicroBatchPlanError.BAD_BATCH
        )
        wrapped.__cause__ = error
        return _LocalStage(None, None, wrapped, wrapped.code, arguments)


def _try_partition(local: _LocalPlan, count: int) -> tuple[Optional[list[list[int]]], bool, Optional[Exception]]:
    """Partition at ``count``: (partition, within the cap with exactly ``count`` non-empty parts, error)."""
    try:
        if count == local.num_groups < local.count:  # a short rank (dummies): one group per part,
            # each group was checked against the cap
            candidate = [[group] for group in range(count)]
        else:
            candidate = local.partition_at(count)
    except Exception as error:  # noqa: BLE001 - a bug here must not leave the peers blocked
        return None, False, error
    within_limit = candidate is not None and len(candidate) == count and all(map(local.fits, candidate))
    return candidate, within_limit, None


def _finish(stage: _LocalStage, group_parts: list[list[int]], use_dynamic_bsz_balance: bool) -> list[list[int]]:
    """Sample index lists of a group partition, ordered as ``micro_batch_order`` says if
    ``use_dynamic_bsz_balance`` (:mod:`seqbal.order`), else in the partitioner's order."""
    assert stage.plan is not None and stage.lengths is not None and stage.arguments is not None
    plan = stage.plan
    parts = plan.samples_of(group_parts)
    if not use_dynamic_bsz_balance:
        return parts
    cost = plan.cost_model
    if stage.arguments.micro_batch_order == "largest_first":
        return _largest_first(plan, stage.lengths, group_parts, parts)
    if not cost.padded:  # the workloads the plan balanced
        return order_for_pipeline(parts, plan.sample_workloads)
    # A padded micro-batch computes on samples x its longest.
    measured = cost.rounded(stage.lengths)
    longest = [int(measured[p].max()) for p in parts]
    return _pipeline_order(parts, [len(p) * int(w) for p, w in zip(parts, plan.workload_model(np.array(longest)))])


def _largest_first(plan: _LocalPlan, lengths: np.ndarray, group_parts: list[list[int]],
                   parts: list[list[int]]) -> list[list[int]]:
    """``parts`` by their cost against the cap (what the cap bounds: tokens, ``samples x
    longest``, a window or bytes), largest first; ties by workload, then first index. O(k log k)."""
    sizes = [plan.part_cost(part) for part in group_parts]
    if plan.cost_model.padded:
        measured = plan.cost_model.rounded(lengths)
        longest = np.array([int(measured[p].max()) for p in parts], dtype=np.int64)
        work = [len(p) * int(w) for p, w in zip(parts, plan.workload_model(longest))]
    else:
        work = _sums(plan.sample_workloads, parts)
    return [parts[i] for i in ranked("largest_first", work, sizes, [p[0] for p in parts])]
