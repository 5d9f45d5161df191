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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import torch

from .plan import _REASONS, MicroBatchPlanError, _check_dp_group, _rank_name
from .validation import check_is_partition

__all__ = ["LOSS_MODES", "GRAD_REDUCTIONS", "loss_weights"]

#: The aggregation modes, by verl's ``loss_agg_mode`` names.
LOSS_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
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


def _tokens_per_sample(mask: Any, key: str, position: int) -> torch.Tensor:
    """Loss tokens of each row of a dense ``[b, T]`` or jagged nested ``[b, j]`` mask.

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
        return torch.stack([row.sum(dtype=torch.int64) for row in rows]) if rows else torch.zeros(0, dtype=torch.int64)
    _check_zero_one(mask, key, position)
    return mask.sum(-1, dtype=torch.int64)


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


def _local_counts(
    micro_batches: Sequence[Any],
    batch_idx_list: Sequence[Sequence[int]],
    key: str,
    mode: Any,
    grad_reduction: Any,
    dtype: Any = None,
) -> tuple[list[Optional[torch.Tensor]], list[int], list[tuple[torch.device, torch.dtype]]]:
    """Per micro-batch, each sample's loss tokens (None for a dummy), its row count, and the
    device and dtype of its weights."""
    if mode not in LOSS_MODES:
        raise MicroBatchPlanError(f"mode must be one of {list(LOSS_MODES)}, got {mode!r}", MicroBatchPlanError.BAD_ARGUMENT)
    if grad_reduction not in GRAD_REDUCTIONS:
        raise MicroBatchPlanError(
            f"grad_reduction must be 'mean' (DDP/FSDP average gradients over dp_group) or 'sum', got {grad_reduction!r}",
            MicroBatchPlanError.BAD_ARGUMENT,
        )
    dtype = _weight_dtype(dtype)
    if len(micro_batches) != len(batch_idx_list):
        raise MicroBatchPlanError(
            f"got {len(micro_batches)} micro-batches but {len(batch_idx_list)} index lists; pass both as "
            f"rearrange_micro_batches returned them",
            MicroBatchPlanError.BAD_ARGUMENT,
        )
    tokens: list[Optional[torch.Tensor]] = []
    rows: list[int] = []
    targets: list[tuple[torch.device, torch.dtype]] = []
    parts = [_index_list(part, position) for position, part in enumerate(batch_idx_list)]
    for position, (micro_batch, part) in enumerate(zip(micro_batches, parts)):
        mask = _entry(micro_batch, key)
        counts = _tokens_per_sample(mask, key, position)
        if part and len(part) != len(counts):
            raise MicroBatchPlanError(
                f"micro-batch {position} has {len(counts)} rows in {key} but its index list holds {len(part)} samples",
                MicroBatchPlanError.BAD_BATCH,
            )
        tokens.append(counts if part else None)
        rows.append(len(counts))
        targets.append((mask.device, dtype or (mask.dtype if mask.is_floating_point() else torch.get_default_dtype())))
    try:  # the index lists must name this rank's samples 0..n-1, each once (dummies aside)
        check_is_partition(parts, sum(len(part) for part in parts))
    except ValueError as error:
        raise MicroBatchPlanError(
            f"batch_idx_list: {error}; pass the index lists rearrange_micro_batches returned with the micro-batches",
            MicroBatchPlanError.BAD_ARGUMENT,
        ) from None
    return tokens, rows, targets


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


def _choices(ok: bool, mode: Any, grad_reduction: Any) -> list[int]:
    """One-hot mode and reduction: their sums show whether every rank passed the same ones."""
    return [int(ok and mode == name) for name in LOSS_MODES] + [int(ok and grad_reduction == name) for name in GRAD_REDUCTIONS]


def _mismatched(sums: Sequence[int], world: int, group_name: str) -> Optional[MicroBatchPlanError]:
    """The agreed error for ranks that passed different ``mode`` or ``grad_reduction``."""
    mode_counts, reduction_counts = list(sums[:3]), list(sums[3:5])
    if max(mode_counts) == world and max(reduction_counts) == world:
        return None
    return MicroBatchPlanError(
        f"the ranks of {group_name} passed different arguments to loss_weights: ranks per mode "
        f"{dict(zip(LOSS_MODES, mode_counts))}, per grad_reduction {dict(zip(GRAD_REDUCTIONS, reduction_counts))}; "
        f"pass the same mode and grad_reduction on every rank",
        MicroBatchPlanError.MISMATCHED_ARGUMENTS,
    )


def _peer_error(code: int, name: str) -> MicroBatchPlanError:
    reason = _REASONS.get(code, f"error code {code}")
    return MicroBatchPlanError(
        f"loss_weights: {name} failed: {reason}; this rank's own micro-batches were valid, see that rank's error", code
    )


def _context_parallel_counts(
    tokens: list[Optional[torch.Tensor]], problem: Optional[Exception], mode: Any, grad_reduction: Any, cp_group: Any
) -> tuple[list[Optional[torch.Tensor]], Optional[Exception], int]:
    """Each sample's loss tokens summed over ``cp_group`` (its shards), the agreed problem of the
    group (this rank's, a peer's, or different sample counts), and the group's size.

    Two SUM all-reduces: the rows and arguments with every rank's error code, then, only where
    that agreement found nothing wrong (so every rank of the group takes the same branch), the
    per-sample counts. O(samples).
    """
    from . import collectives

    ok = problem is None
    own = torch.cat([t for t in tokens if t is not None]) if ok and any(t is not None for t in tokens) else (
        torch.zeros(0, dtype=torch.int64))
    samples = len(own) if ok else 0
    header = collectives.sum_with_error(
        [samples, samples * samples, *_choices(ok, mode, grad_reduction)],
        problem.code if problem is not None else 0, cp_group,
    )
    world = header.world_size
    if header.error_code:
        if problem is None:
            rank = collectives.global_rank(cp_group, header.error_rank)
            problem = _peer_error(header.error_code, f"rank {header.error_rank} of the context-parallel group (global rank {rank})")
        return tokens, problem, world
    mismatch = _mismatched(header.sums[2:], world, "cp_group")
    if mismatch is None and header.sums[0] * header.sums[0] != world * header.sums[1]:
        # equal sums of n and n**2 over the ranks hold only when every rank has the same n
        mismatch = MicroBatchPlanError(
            f"the ranks of cp_group hold different numbers of samples ({header.sums[0]} over {world} ranks); "
            f"context-parallel ranks must pass the same micro-batches and index lists, each with its own shard "
            f"of the loss mask",
            MicroBatchPlanError.MISMATCHED_ARGUMENTS,
        )
    if mismatch is not None:
        return tokens, mismatch, world
    summed = collectives.sum_with_error(own.tolist(), 0, cp_group).sums
    full = torch.tensor(summed, dtype=torch.int64)
    out: list[Optional[torch.Tensor]] = []
    start = 0
    for counts in tokens:
        if counts is None:
            out.append(None)
            continue
        out.append(full[start:start + len(counts)])
        start += len(counts)
    return out, None, world


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
) -> list[torch.Tensor]:
    """A weight per sample of every micro-batch, so that accumulated gradients are exact.

    The contract: for every micro-batch ``i``, back-propagate
    ``(token_loss_i * micro_batches[i][loss_mask_key] * w[i][:, None]).sum()``, then let the
    engine reduce gradients over ``dp_group`` (``grad_reduction``). The accumulated gradient is
    then the gradient of the global loss ``L`` of the step, over every sample ``s`` of every
    rank, with ``m`` the loss mask, ``n_s = sum_t m_st`` the loss tokens of ``s``,
    ``N = sum_s n_s``, ``S`` the number of sequences (dummies excluded) and ``W`` the size of
    ``dp_group``:

    - ``"token-mean"``: ``L = sum_s sum_t m_st l_st / N``, so ``w_s = f / N``;
    - ``"seq-mean-token-mean"``: ``L = (1/S) sum_s (sum_t m_st l_st) / n_s``, so
      ``w_s = f / (S n_s)``; a sequence with no loss token contributes 0 but still counts
      in ``S`` (as in verl, whose ``global_batch_size`` is the mini-batch size), and gets 0;
    - ``"seq-mean-token-sum"``: ``L = (1/S) sum_s sum_t m_st l_st``, so ``w_s = f / S``;

    where ``f = W`` for ``grad_reduction="mean"`` (DDP and FSDP average gradients: the factor
    undoes it) and ``f = 1`` for ``"sum"``. Without a ``dp_group`` (or without an initialised
    process group) the counts are this rank's and ``W = 1``. ``N = 0`` gives zero weights (no
    token to learn from). Dummy micro-batches (empty index list) get zero weights.

    Context parallel (``cp_group``: ring attention, Ulysses): the ``C`` ranks of ``cp_group``
    hold the same micro-batches and index lists (one plan, made over ``dp_group``), each with
    its own shard of every sequence's tokens and of its loss mask. Each CP rank
    back-propagates the contract's sum over its shard, and the engine reduces gradients over
    all ``W x C`` ranks of DP x CP (FSDP over its ``dp_shard_cp`` mesh). ``n_s`` is then the
    sum of the shards' counts over ``cp_group`` (so ``N`` and ``S`` count each sequence once,
    not once per shard: counted over ``dp_group`` alone they would be the shards'), and
    ``f = W x C`` for ``"mean"``; every CP rank gets the same weights. ``dp_group`` is this
    rank's data-parallel group (one rank per replica, the same CP position), as for the plan.

    Args:
        micro_batches: the micro-batches (TensorDicts, mappings or DataProtos), as returned by
            :func:`seqbal.rearrange_micro_batches` (dummies included).
        batch_idx_list: their index lists (``[]`` for a dummy).
        loss_mask_key: the key of the loss mask: dense ``[b, T]`` or jagged nested ``[b, j]``,
            bool or 0/1. Default ``"response_mask"`` (verl's).
        mode: ``"token-mean"``, ``"seq-mean-token-mean"`` or ``"seq-mean-token-sum"`` (verl's
            ``loss_agg_mode`` names). Default ``"token-mean"``.
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

    Returns:
        One 1-D tensor per micro-batch (of ``dtype``), on its mask's device, a weight per row.
        O(total tokens) for the counts; one all-reduce of ``2 + 5 + W`` int64s with a group;
        with a ``cp_group`` of ``C`` ranks, two more over it first (``2 + 5 + C`` int64s, then
        one per sample of this rank).

    Raises:
        ValueError: (:class:`~seqbal.MicroBatchPlanError`) a bad ``mode`` or
            ``grad_reduction``, a missing key, a mask that is not ``[b, T]`` or not 0/1, a
            row count that differs from the index list, or as many micro-batches as index
            lists not given; index lists that do not name this rank's samples ``0..n-1``
            once each (dummies aside); a ``dtype`` that is not a floating torch.dtype; ranks
            that pass different ``mode`` or ``grad_reduction``; CP ranks holding different
            numbers of samples. With groups every rank of DP x CP raises together (a rank
            whose own input was fine names the failing rank, or the rank of its DP group
            whose CP group failed).

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
    """
    _check_dp_group(dp_group)
    _check_cp_group(cp_group)
    from . import collectives

    sync = dp_group is not None and collectives.is_sync_mode(dp_group, True)
    cp_sync = cp_group is not None and collectives.is_sync_mode(cp_group, True)
    problem: Optional[Exception] = None
    tokens: list[Optional[torch.Tensor]] = []
    targets: list[tuple[torch.device, torch.dtype]] = []
    rows: list[int] = []
    try:
        tokens, rows, targets = _local_counts(micro_batches, batch_idx_list, loss_mask_key, mode, grad_reduction, dtype)
    except MicroBatchPlanError as error:
        problem = error
    except Exception as error:  # noqa: BLE001 - in sync mode even a surprise must reach the peers
        if not (sync or cp_sync):
            raise
        problem = MicroBatchPlanError(f"the micro-batches could not be read: {type(error).__name__}: {error}",
                                      MicroBatchPlanError.BAD_BATCH)
        problem.__cause__ = error
    cp_world = 1
    if cp_sync:  # every rank of cp_group calls this, whatever its own input
        tokens, problem, cp_world = _context_parallel_counts(tokens, problem, mode, grad_reduction, cp_group)
    local_tokens = sum(int(t.sum()) for t in tokens if t is not None) if problem is None else 0
    local_sequences = sum(len(t) for t in tokens if t is not None) if problem is None else 0
    if not sync:
        if problem is not None:
            raise problem
        world, global_tokens, global_sequences = 1, local_tokens, local_sequences
    else:
        agreed = collectives.sum_with_error(
            [local_tokens, local_sequences, *_choices(problem is None, mode, grad_reduction)],
            problem.code if problem is not None else 0, dp_group,
        )
        world = agreed.world_size
        if agreed.error_code:
            if problem is not None:
                raise problem
            raise _peer_error(agreed.error_code, _rank_name(dp_group, agreed.error_rank))
        mismatch = _mismatched(agreed.sums[2:], world, "the data-parallel group")
        if mismatch is not None:
            raise mismatch
        global_tokens, global_sequences = agreed.sums[0], agreed.sums[1]
    factor = float(world * cp_world if grad_reduction == "mean" else 1)
    weights = []
    for counts, n_rows, (device, weight_dtype) in zip(tokens, rows, targets):
        if counts is None:  # a dummy micro-batch
            weights.append(torch.zeros(n_rows, dtype=weight_dtype, device=device))
            continue
        counts = counts.to(torch.float64)
        if mode == "token-mean":
            scale = factor / global_tokens if global_tokens else 0.0
            weight = torch.full_like(counts, scale)
        elif mode == "seq-mean-token-mean":
            weight = torch.where(counts > 0, factor / (global_sequences * counts.clamp(min=1)), torch.zeros_like(counts))
        else:  # seq-mean-token-sum
            weight = torch.full_like(counts, factor / global_sequences)
        weights.append(weight.to(device=device, dtype=weight_dtype))
    return weights
