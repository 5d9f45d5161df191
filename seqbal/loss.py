"""loss_weights: the per-sample loss scale that makes dynamic micro-batches exact.

With micro-batches of different token counts, gradient accumulation and data-parallel
averaging, a loss averaged per micro-batch is not the loss of the step: a token of a small
micro-batch weighs more than a token of a big one, and a rank with fewer tokens weighs as much
as a rank with more. The right scale depends only on global counts (loss tokens, sequences) over
every micro-batch of every rank, so it is computed once per step, in one all-reduce, and handed
back as a weight per sample: the trainer multiplies its token losses by it and sums, which is
exact for any split. The weights are built here rather than folded into a loss function so that
any loss (PPO clip, SFT NLL, KL terms) uses them the same way.

The all-reduce carries this rank's error code too, as the planner's agreement does (see
``plan.py``): a rank with a missing mask key does not raise alone and leave its peers waiting in
the collective; every rank learns of it and raises together. Under context parallelism a
sequence's tokens are sharded over ``cp_group``: its counts are summed over that group first
(two more all-reduces, carrying the errors the same way), so that every shard is weighted by
the whole sequence's count and every error reaches the whole DP x CP grid.

What a SUM cannot combine travels in per-rank slots of the same all-reduce: the arguments every
rank must pass alike (mode, reduction, scale factor, whether groups are the unit), compared
exactly, and each rank's widest loss mask, whose maximum is the default horizon of
``seq-mean-token-sum-norm``, so the five modes still cost one collective. Groups (a preference
pair, a GRPO group) are read by ``loss_units.py``; they only change what the ``seq-mean``
modes count as one unit.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .plan import _REASONS, MicroBatchPlanError, _check_dp_group, _rank_name
from .loss_units import unit_labels
from .validation import check_is_partition

__all__ = ["LOSS_MODES", "GRAD_REDUCTIONS", "loss_weights"]

#: The aggregation modes: every ``loss_agg_mode`` of verl 0.9.1's ``agg_loss``, by its names.
LOSS_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")
#: How the engine reduces gradients over ``dp_group``: DDP/FSDP average ("mean"), or sum.
GRAD_REDUCTIONS = ("mean", "sum")


def _entry(micro_batch: Any, key: str) -> Any:
    """``micro_batch[key]`` of a TensorDict or mapping, or of a DataProto's ``batch``."""
    if hasattr(micro_batch, "non_tensor_batch") and hasattr(micro_batch, "batch"):
        micro_batch = micro_batch.batch
    if micro_batch is None or not hasattr(micro_batch, "keys"):
        raise MicroBatchPlanError(
            f"a micro-batch must be a TensorDict (or a mapping, or a DataProto), got {type(micro_batch).__name__}",
            MicroBatchPlanError.BAD_BATCH,
        )
    if key not in micro_batch.keys():
        keys = sorted(map(str, micro_batch.keys()))[:12]
        raise MicroBatchPlanError(
            f"loss_mask_key={key!r} is not in the micro-batch (keys: {keys}); pass the key of the loss mask",
            MicroBatchPlanError.BAD_BATCH,
        )
    return micro_batch.get(key) if not isinstance(micro_batch, Mapping) else micro_batch[key]


def _check_zero_one(values: torch.Tensor, key: str, position: int) -> None:
    if values.dtype == torch.bool or values.numel() == 0:
        return
    if values.is_complex():
        raise MicroBatchPlanError(f"{key} of micro-batch {position} is complex ({values.dtype})", MicroBatchPlanError.BAD_BATCH)
    bad = ~((values == 0) | (values == 1))
    if bool(bad.any()):
        value = values[bad][0].item()
        raise MicroBatchPlanError(
            f"{key} of micro-batch {position} must be bool or hold only 0 and 1, got {value:.6g} "
            f"({int(bad.sum())} such value(s), dtype {values.dtype}); a loss mask says which tokens count",
            MicroBatchPlanError.BAD_BATCH,
        )


def _tokens_per_sample(mask: Any, key: str, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss tokens and width (``T``, or the row's own length) of each row of a dense ``[b, T]``
    or jagged nested ``[b, j]`` mask.

    Exactly two dimensions: a ``[b, T, k]`` mask would count each token ``k`` times, silently
    wrong weights, so it is an error (agreed like every other) naming its shape."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        if not isinstance(mask, torch.Tensor):
            shape = type(mask).__name__
        elif mask.is_nested:
            shape = f"a nested tensor of {mask.dim()} dimensions"
        else:
            shape = f"shape {list(mask.shape)}"
        raise MicroBatchPlanError(
            f"{key} of micro-batch {position} must be a [b, T] tensor (dense or jagged nested, one 0/1 entry "
            f"per token), got {shape}",
            MicroBatchPlanError.BAD_BATCH,
        )
    if mask.is_nested:
        rows = mask.unbind()
        for row in rows:
            _check_zero_one(row, key, position)
        if not rows:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
        widths = torch.tensor([row.shape[0] for row in rows], dtype=torch.int64)
        return torch.stack([row.sum(dtype=torch.int64) for row in rows]), widths
    _check_zero_one(mask, key, position)
    return mask.sum(-1, dtype=torch.int64), torch.full((mask.shape[0],), mask.shape[-1], dtype=torch.int64)


def _weight_dtype(dtype: Any) -> Optional[torch.dtype]:
    """``dtype`` checked: None (follow each mask) or a floating torch.dtype."""
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise MicroBatchPlanError(
            f"dtype must be a floating torch.dtype (torch.float64, torch.float32, torch.bfloat16, ...) or None, "
            f"got {dtype!r}",
            MicroBatchPlanError.BAD_ARGUMENT,
        )
    return dtype


def _index_list(part: Any, position: int) -> list[Any]:
    """An index list as a Python list (arrays and tensors as their values)."""
    values = part.tolist() if hasattr(part, "tolist") else part
    try:
        return list(values) if not isinstance(values, (str, bytes)) else [values]
    except TypeError:
        raise MicroBatchPlanError(
            f"batch_idx_list[{position}] must be a list of sample indices, got {type(part).__name__}",
            MicroBatchPlanError.BAD_ARGUMENT,
        ) from None


def _scale_factor_bits(value: Any) -> int:
    """``loss_scale_factor`` checked (None, or a finite number > 0) as the int64 of its float64
    bits, 0 for None: how the ranks compare it exactly in an integer all-reduce."""
    if value is None:
        return 0
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, (bool, str, bytes)) or not math.isfinite(number) or number <= 0:
        raise MicroBatchPlanError(
            f"loss_scale_factor must be None (the response horizon) or a finite number > 0, got {value!r}",
            MicroBatchPlanError.BAD_ARGUMENT,
        )
    return struct.unpack("<q", struct.pack("<d", number))[0]


def _factor_of(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


@dataclass
class _Local:
    """This rank's reading of its micro-batches: per micro-batch, each sample's loss tokens and
    mask width (None for a dummy) and its unit's label; the unit count; each micro-batch's row
    count and the device and dtype of its weights."""

    tokens: list[Optional[torch.Tensor]]
    widths: list[Optional[torch.Tensor]]
    labels: list[list[int]]
    units: int
    grouped: bool
    rows: list[int]
    targets: list[tuple[torch.device, torch.dtype]]

    def samples(self) -> int:
        return sum(len(t) for t in self.tokens if t is not None)

    def max_width(self) -> int:
        return max((int(w.max()) for w in self.widths if w is not None and len(w)), default=0)


_NOTHING = _Local([], [], [], 0, False, [], [])


def _local_counts(
    micro_batches: Sequence[Any],
    batch_idx_list: Sequence[Sequence[int]],
    key: str,
    dtype: Any,
    force_group_size: Any,
    group_ids: Any,
) -> _Local:
    """Read and check this rank's micro-batches, index lists and groups (no collective)."""
    dtype = _weight_dtype(dtype)
    if len(micro_batches) != len(batch_idx_list):
        raise MicroBatchPlanError(
            f"got {len(micro_batches)} micro-batches but {len(batch_idx_list)} index lists; pass both as "
            f"rearrange_micro_batches returned them",
            MicroBatchPlanError.BAD_ARGUMENT,
        )
    local = _Local([], [], [], 0, False, [], [])
    parts = [_index_list(part, position) for position, part in enumerate(batch_idx_list)]
    for position, (micro_batch, part) in enumerate(zip(micro_batches, parts)):
        mask = _entry(micro_batch, key)
        counts, widths = _tokens_per_sample(mask, key, position)
        if part and len(part) != len(counts):
            raise MicroBatchPlanError(
                f"micro-batch {position} has {len(counts)} rows in {key} but its index list holds {len(part)} samples",
                MicroBatchPlanError.BAD_BATCH,
            )
        local.tokens.append(counts if part else None)
        local.widths.append(widths if part else None)
        local.rows.append(len(counts))
        local.targets.append((mask.device, dtype or (mask.dtype if mask.is_floating_point() else torch.get_default_dtype())))
    samples = sum(len(part) for part in parts)
    try:  # the index lists must name this rank's samples 0..n-1, each once (dummies aside)
        check_is_partition(parts, samples)
    except ValueError as error:
        raise MicroBatchPlanError(
            f"batch_idx_list: {error}; pass the index lists rearrange_micro_batches returned with the micro-batches",
            MicroBatchPlanError.BAD_ARGUMENT,
        ) from None
    try:
        local.labels, local.units, local.grouped = unit_labels(parts, samples, force_group_size, group_ids)
    except ValueError as error:
        raise MicroBatchPlanError(str(error), MicroBatchPlanError.BAD_ARGUMENT) from None
    return local


def _check_arguments(mode: Any, grad_reduction: Any, loss_scale_factor: Any) -> int:
    """Check the arguments every rank must pass alike; ``loss_scale_factor``'s bits."""
    if mode not in LOSS_MODES:
        raise MicroBatchPlanError(f"mode must be one of {list(LOSS_MODES)}, got {mode!r}", MicroBatchPlanError.BAD_ARGUMENT)
    if grad_reduction not in GRAD_REDUCTIONS:
        raise MicroBatchPlanError(
            f"grad_reduction must be 'mean' (DDP/FSDP average gradients over dp_group) or 'sum', got {grad_reduction!r}",
            MicroBatchPlanError.BAD_ARGUMENT,
        )
    return _scale_factor_bits(loss_scale_factor)


def _check_cp_group(cp_group: Any) -> None:
    """``cp_group`` must be None or a ProcessGroup; checked before any collective."""
    if cp_group is None:
        return
    from . import collectives

    if not collectives.is_process_group(cp_group):
        raise MicroBatchPlanError(
            f"cp_group must be None or a torch.distributed ProcessGroup (the context-parallel ranks that share "
            f"this rank's samples), got {type(cp_group).__name__} {cp_group!r}",
            MicroBatchPlanError.BAD_ARGUMENT,
        )


#: The arguments every rank must pass alike, in the order of :func:`_fingerprint`.
_ARGUMENTS = ("mode", "grad_reduction", "the unit (samples, or groups)", "loss_scale_factor")


def _fingerprint(mode: Any, grad_reduction: Any, grouped: bool, factor_bits: int) -> list[int]:
    """The arguments as ints (mode and reduction by position, 1-based; then the unit; the
    factor's bits), for every rank to compare in the all-reduce."""
    return [LOSS_MODES.index(mode) + 1, GRAD_REDUCTIONS.index(grad_reduction) + 1, 1 + int(grouped), factor_bits]


def _decoded(position: int, value: int) -> Any:
    if position == 0:
        return LOSS_MODES[value - 1]
    if position == 1:
        return GRAD_REDUCTIONS[value - 1]
    if position == 2:
        return "groups" if value == 2 else "samples"
    return None if value == 0 else _factor_of(value)


def _mismatched(fingerprints: Sequence[Sequence[int]], group_name: str) -> Optional[MicroBatchPlanError]:
    """The agreed error for ranks that passed different arguments (every rank's fingerprint)."""
    differing = [position for position in range(len(_ARGUMENTS)) if len({f[position] for f in fingerprints}) > 1]
    if not differing:
        return None
    what = "; ".join(
        f"{_ARGUMENTS[position]} by rank {[_decoded(position, f[position]) for f in fingerprints]}" for position in differing
    )
    return MicroBatchPlanError(
        f"the ranks of {group_name} passed different arguments to loss_weights: {what}; pass the same mode, "
        f"grad_reduction and loss_scale_factor, and groups (force_group_size or group_ids) on every rank or on none",
        MicroBatchPlanError.MISMATCHED_ARGUMENTS,
    )


def _peer_error(code: int, name: str) -> MicroBatchPlanError:
    reason = _REASONS.get(code, f"error code {code}")
    return MicroBatchPlanError(
        f"loss_weights: {name} failed: {reason}; this rank's own micro-batches were valid, see that rank's error", code
    )


def _context_parallel_counts(
    local: _Local, problem: Optional[Exception], fingerprint: list[int], cp_group: Any
) -> tuple[_Local, Optional[Exception], int]:
    """Each sample's loss tokens and mask width summed over ``cp_group`` (its shards), the
    agreed problem of the group (this rank's, a peer's, different arguments, or different
    samples or groups), and the group's size.

    Two SUM all-reduces: every rank's arguments, samples, units and error code, then, only
    where that agreement found nothing wrong (so every rank of the group takes the same branch),
    the per-sample counts and widths. O(samples).
    """
    from . import collectives

    ok = problem is None
    header = collectives.sum_with_error(
        [], problem.code if problem is not None else 0, cp_group,
        per_rank=[*fingerprint, local.samples(), local.units] if ok else [0] * (len(fingerprint) + 2),
    )
    world = header.world_size
    if header.error_code:
        if problem is None:
            rank = collectives.global_rank(cp_group, header.error_rank)
            problem = _peer_error(header.error_code, f"rank {header.error_rank} of the context-parallel group (global rank {rank})")
        return local, problem, world
    mismatch = _mismatched([row[:len(_ARGUMENTS)] for row in header.per_rank], "cp_group")
    shapes = [tuple(row[len(_ARGUMENTS):]) for row in header.per_rank]
    if mismatch is None and len(set(shapes)) > 1:
        mismatch = MicroBatchPlanError(
            f"the ranks of cp_group hold different numbers of samples or groups ((samples, units) by rank {shapes}); "
            f"context-parallel ranks must pass the same micro-batches, index lists and groups, each with its own "
            f"shard of the loss mask",
            MicroBatchPlanError.MISMATCHED_ARGUMENTS,
        )
    if mismatch is not None:
        return local, mismatch, world
    present = [(t, w) for t, w in zip(local.tokens, local.widths) if t is not None]
    own = [int(v) for t, _ in present for v in t] + [int(v) for _, w in present for v in w]
    summed = collectives.sum_with_error(own, 0, cp_group).sums
    samples = len(own) // 2
    full_tokens = torch.tensor(summed[:samples], dtype=torch.int64)
    full_widths = torch.tensor(summed[samples:], dtype=torch.int64)
    tokens: list[Optional[torch.Tensor]] = []
    widths: list[Optional[torch.Tensor]] = []
    start = 0
    for counts in local.tokens:
        if counts is None:
            tokens.append(None)
            widths.append(None)
            continue
        tokens.append(full_tokens[start:start + len(counts)])
        widths.append(full_widths[start:start + len(counts)])
        start += len(counts)
    return _Local(tokens, widths, local.labels, local.units, local.grouped, local.rows, local.targets), None, world


def _unit_tokens(local: _Local) -> torch.Tensor:
    """Loss tokens of each unit of this rank (float64), from its members' counts. O(samples)."""
    totals = torch.zeros(local.units, dtype=torch.float64)
    for counts, labels in zip(local.tokens, local.labels):
        if counts is not None and len(counts):
            totals.index_add_(0, torch.tensor(labels, dtype=torch.int64), counts.to(torch.float64))
    return totals


def _weights(local: _Local, mode: str, factor: float, tokens: int, units: int, horizon: float) -> list[torch.Tensor]:
    """Each micro-batch's weights from the global counts (see :func:`loss_weights`)."""
    unit_tokens = _unit_tokens(local) if mode == "seq-mean-token-mean" else None
    weights = []
    for counts, labels, n_rows, (device, weight_dtype) in zip(local.tokens, local.labels, local.rows, local.targets):
        if counts is None:  # a dummy micro-batch
            weights.append(torch.zeros(n_rows, dtype=weight_dtype, device=device))
            continue
        if mode == "token-mean":
            weight = torch.full((len(counts),), factor / tokens if tokens else 0.0, dtype=torch.float64)
        elif mode == "token-sum":
            weight = torch.full((len(counts),), factor, dtype=torch.float64)
        elif mode == "seq-mean-token-sum":
            weight = torch.full((len(counts),), factor / units if units else 0.0, dtype=torch.float64)
        elif mode == "seq-mean-token-sum-norm":
            scale = factor / (units * horizon) if units and horizon else 0.0
            weight = torch.full((len(counts),), scale, dtype=torch.float64)
        else:  # seq-mean-token-mean: the unit's tokens, summed over its members
            own = unit_tokens[torch.tensor(labels, dtype=torch.int64)] if labels else torch.zeros(0, dtype=torch.float64)
            weight = torch.where(own > 0, factor / (units * own.clamp(min=1)), torch.zeros_like(own))
        weights.append(weight.to(device=device, dtype=weight_dtype))
    return weights


def loss_weights(
    micro_batches: Sequence[Any],
    batch_idx_list: Sequence[Sequence[int]],
    *,
    loss_mask_key: str = "response_mask",
    mode: str = "token-mean",
    dp_group: Any = None,
    grad_reduction: str = "mean",
    dtype: Optional[torch.dtype] = None,
    cp_group: Any = None,
    loss_scale_factor: Optional[float] = None,
    force_group_size: int = 1,
    group_ids: Optional[Sequence[Any]] = None,
) -> list[torch.Tensor]:
    """A weight per sample of every micro-batch, so that accumulated gradients are exact.

    The contract: for every micro-batch ``i``, back-propagate
    ``(token_loss_i * micro_batches[i][loss_mask_key] * w[i][:, None]).sum()``, then let the
    engine reduce gradients over ``dp_group`` (``grad_reduction``). The accumulated gradient is
    then the gradient of the global loss ``L`` of the step, over every sample ``s`` of every
    rank, with ``m`` the loss mask, ``n_s = sum_t m_st`` the loss tokens of ``s``,
    ``N = sum_s n_s``, ``S`` the number of sequences (dummies excluded) and ``W`` the size of
    ``dp_group`` (these are verl 0.9.1's ``agg_loss`` modes, over the whole global batch, with
    ``global_batch_size=S`` as verl's trainers pass it):

    - ``"token-mean"``: ``L = sum_s sum_t m_st l_st / N``, so ``w_s = f / N``;
    - ``"token-sum"``: ``L = sum_s sum_t m_st l_st``, so ``w_s = f``;
    - ``"seq-mean-token-sum"``: ``L = (1/S) sum_s sum_t m_st l_st``, so ``w_s = f / S``;
    - ``"seq-mean-token-sum-norm"``: that divided by ``loss_scale_factor`` (``H``), so
      ``w_s = f / (S H)``; by default ``H`` is the response horizon, the width of the loss mask
      (``loss_mask.shape[-1]`` of the global batch padded as one: the widest mask row of every
      micro-batch of every rank, a jagged row counting its own length);
    - ``"seq-mean-token-mean"``: ``L = (1/S) sum_s (sum_t m_st l_st) / n_s``, so
      ``w_s = f / (S n_s)``;

    where ``f = W`` for ``grad_reduction="mean"`` (DDP and FSDP average gradients: the factor
    undoes it) and ``f = 1`` for ``"sum"``. A sequence with no loss token contributes 0 but
    still counts in ``S`` (verl's trainers pass the mini-batch size as ``global_batch_size``;
    ``agg_loss`` called without it counts only sequences that have a loss token), and gets 0
    in ``"seq-mean-token-mean"``. Without a ``dp_group`` (or without an initialised process
    group) the counts are this rank's and ``W = 1``. ``N = 0`` gives zero weights (no token to
    learn from). Dummy micro-batches (empty index list) get zero weights.

    Groups as the unit of the mean (``force_group_size`` or ``group_ids``: a preference pair, a
    GRPO group): in the ``seq-mean`` modes the unit ``s`` above is the group, ``S`` the number
    of groups of every rank, ``n_s`` the loss tokens of all its members; every member gets its
    group's weight, so each group weighs the same wherever its members sit. A loss computed per
    group (a DPO pair's ``-log sigmoid(beta * margin)``) takes its group's weight once: with
    ``"seq-mean-token-sum"`` and groups, ``L = (1/G) sum_g loss_g`` is the gradient of
    ``sum_g w_g loss_g`` summed per micro-batch. A group's members must share a micro-batch
    (the planner's ``force_group_size`` keeps them so); groups are counted per rank, never
    matched across ranks. ``"token-mean"`` and ``"token-sum"`` do not depend on groups.

    Context parallel (``cp_group``: ring attention, Ulysses): the ``C`` ranks of ``cp_group``
    hold the same micro-batches and index lists (one plan, made over ``dp_group``), each with
    its own shard of every sequence's tokens and of its loss mask. Each CP rank
    back-propagates the contract's sum over its shard, and the engine reduces gradients over
    all ``W x C`` ranks of DP x CP (FSDP over its ``dp_shard_cp`` mesh). ``n_s`` and the mask
    widths are then the sums of the shards' over ``cp_group`` (so ``N`` and ``S`` count each
    sequence once, not once per shard: counted over ``dp_group`` alone they would be the
    shards'), and ``f = W x C`` for ``"mean"``; every CP rank gets the same weights.
    ``dp_group`` is this rank's data-parallel group (one rank per replica, the same CP
    position), as for the plan.

    Args:
        micro_batches: the micro-batches (TensorDicts, mappings or DataProtos), as returned by
            :func:`seqbal.rearrange_micro_batches` (dummies included).
        batch_idx_list: their index lists (``[]`` for a dummy).
        loss_mask_key: the key of the loss mask: dense ``[b, T]`` or jagged nested ``[b, j]``,
            bool or 0/1. Default ``"response_mask"`` (verl's).
        mode: one of :data:`LOSS_MODES` (verl's ``loss_agg_mode`` names). Default
            ``"token-mean"``.
        dp_group: the data-parallel process group whose samples make the step; None for one
            rank. Must be the group the gradients are reduced over.
        grad_reduction: ``"mean"`` (DDP/FSDP, over DP x CP with a ``cp_group``) or ``"sum"``.
            Default ``"mean"``.
        dtype: the weights' floating dtype. Default None: the mask's own dtype where it is
            floating, else ``torch.get_default_dtype()``. The counts are exact integers and
            the weights are formed in float64, then rounded once to ``dtype``: pass
            ``torch.float64`` for a float64 loss (float32 weights would make it exact only to
            about 1e-7).
        cp_group: the context-parallel group whose ranks hold shards of this rank's
            sequences; None without context parallelism.
        loss_scale_factor: ``H`` of ``"seq-mean-token-sum-norm"`` (verl's
            ``actor.loss_scale_factor``): a number > 0, or None for the response horizon.
            Pass a constant (the configured maximum response length) to keep the scale the same
            from step to step.
        force_group_size: consecutive samples ``i*g .. i*g+g-1`` of this rank's batch form a
            group, the unit of the ``seq-mean`` modes (as the planner's ``force_group_size``).
            Default 1: each sample is its own unit.
        group_ids: or one hashable id per sample of this rank's batch (the indices of
            ``batch_idx_list``); samples with equal ids form a group. Default None.

    Returns:
        One 1-D tensor per micro-batch (of ``dtype``), on its mask's device, a weight per row.
        O(total tokens) for the counts; one all-reduce of ``2 + 6 W`` int64s with a group;
        with a ``cp_group`` of ``C`` ranks, two more over it first (``7 C`` int64s, then two
        per sample of this rank).

    Raises:
        ValueError: (:class:`~seqbal.MicroBatchPlanError`) a bad ``mode``, ``grad_reduction``
            or ``loss_scale_factor``, a missing key, a mask that is not ``[b, T]`` or not 0/1,
            a row count that differs from the index list, or as many micro-batches as index
            lists not given; index lists that do not name this rank's samples ``0..n-1``
            once each (dummies aside); a ``dtype`` that is not a floating torch.dtype; bad
            groups (``force_group_size`` not dividing the samples, both descriptions, ids of
            the wrong length, a group split over micro-batches); ranks that pass different
            ``mode``, ``grad_reduction``, ``loss_scale_factor`` or groups on some ranks only;
            CP ranks holding different numbers of samples or groups. With groups every rank of
            DP x CP raises together (a rank whose own input was fine names the failing rank, or
            the rank of its DP group whose CP group failed).

    Examples:
        >>> from tensordict import TensorDict
        >>> mbs = [TensorDict({"response_mask": torch.tensor([[1, 1, 1, 0]])}, [1]),
        ...        TensorDict({"response_mask": torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]])}, [2])]
        >>> [w.tolist() for w in loss_weights(mbs, [[1], [0, 2]])]  # 4 loss tokens
        [[0.25], [0.25, 0.25]]
        >>> [w.tolist() for w in loss_weights(mbs, [[1], [0, 2]], mode="seq-mean-token-mean")]
        [[0.1111111119389534], [0.3333333432674408, 0.0]]
        >>> loss_weights(mbs, [[1], [0, 2]], mode="seq-mean-token-mean", dtype=torch.float64)[0].tolist()
        [0.1111111111111111]
        >>> [w.tolist() for w in loss_weights(mbs, [[1], [0, 2]], mode="seq-mean-token-sum-norm")]  # 3 x 4
        [[0.0833333358168602], [0.0833333358168602, 0.0833333358168602]]
        >>> pairs = [TensorDict({"response_mask": torch.ones(4, 2)}, [4])]  # samples 0-1, 2-3: two pairs
        >>> loss_weights(pairs, [[0, 1, 2, 3]], mode="seq-mean-token-sum", force_group_size=2)[0].tolist()
        [0.5, 0.5, 0.5, 0.5]
    """
    _check_dp_group(dp_group)
    _check_cp_group(cp_group)
    from . import collectives

    sync = dp_group is not None and collectives.is_sync_mode(dp_group, True)
    cp_sync = cp_group is not None and collectives.is_sync_mode(cp_group, True)
    problem: Optional[Exception] = None
    local = _NOTHING
    fingerprint = [0] * len(_ARGUMENTS)
    try:
        factor_bits = _check_arguments(mode, grad_reduction, loss_scale_factor)
        local = _local_counts(micro_batches, batch_idx_list, loss_mask_key, dtype, force_group_size, group_ids)
        fingerprint = _fingerprint(mode, grad_reduction, local.grouped, factor_bits)
    except MicroBatchPlanError as error:
        problem = error
    except Exception as error:  # noqa: BLE001 - in sync mode even a surprise must reach the peers
        if not (sync or cp_sync):
            raise
        problem = MicroBatchPlanError(f"the micro-batches could not be read: {type(error).__name__}: {error}",
                                      MicroBatchPlanError.BAD_BATCH)
        problem.__cause__ = error
    if problem is not None:
        local, fingerprint = _NOTHING, [0] * len(_ARGUMENTS)
    cp_world = 1
    if cp_sync:  # every rank of cp_group calls this, whatever its own input
        local, problem, cp_world = _context_parallel_counts(local, problem, fingerprint, cp_group)
    if problem is not None:
        local, fingerprint = _NOTHING, [0] * len(_ARGUMENTS)
    local_tokens = sum(int(t.sum()) for t in local.tokens if t is not None)
    if not sync:
        if problem is not None:
            raise problem
        world, global_tokens, global_units, widest = 1, local_tokens, local.units, local.max_width()
    else:
        agreed = collectives.sum_with_error(
            [local_tokens, local.units], problem.code if problem is not None else 0, dp_group,
            per_rank=[*fingerprint, local.max_width()],
        )
        world = agreed.world_size
        if agreed.error_code:
            if problem is not None:
                raise problem
            raise _peer_error(agreed.error_code, _rank_name(dp_group, agreed.error_rank))
        mismatch = _mismatched([row[:len(_ARGUMENTS)] for row in agreed.per_rank], "the data-parallel group")
        if mismatch is not None:
            raise mismatch
        global_tokens, global_units = agreed.sums
        widest = max(row[len(_ARGUMENTS)] for row in agreed.per_rank)
    factor = float(world * cp_world if grad_reduction == "mean" else 1)
    horizon = float(loss_scale_factor) if loss_scale_factor is not None else float(widest)
    return _weights(local, mode, factor, global_tokens, global_units, horizon)
