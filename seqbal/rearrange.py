"""rearrange_micro_batches and the restore helpers: TensorDict in, micro-batches out.

The decision is made on plain effective lengths by :func:`seqbal.plan.plan_micro_batches`
(NumPy only, with the data-parallel agreement); this module adds what needs torch and
TensorDict: reading the effective lengths from a batch, copying each micro-batch out of it
once, and putting per-sample outputs back in the original order.
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence, Union

import numpy as np
import torch
from tensordict import TensorDict

from .plan import MicroBatchPlanError, _plan
from .tensordict_compat import select_nested_rows, select_rows

__all__ = [
    "effective_lengths",
    "rearrange_micro_batches",
    "get_reverse_idx",
    "restore_dynamic_batch",
]


def effective_lengths(batch: TensorDict) -> torch.Tensor:
    """Effective (non-padding) token count of every sample of ``batch``, as an int64 tensor.

    If ``batch["input_ids"]`` is a nested (jagged) tensor, its per-sample lengths; otherwise
    ``batch["attention_mask"].sum(-1)`` of a 2-D mask. Stays on the batch's device. O(B * S).

    Raises:
        MicroBatchPlanError: neither a nested ``input_ids`` nor an ``attention_mask``, or a mask
            that is not 2-D.
    """
    keys = set(batch.keys())
    if "input_ids" in keys:
        input_ids = batch.get("input_ids")
        if isinstance(input_ids, torch.Tensor) and input_ids.is_nested:
            return input_ids.offsets().diff().long()
    if "attention_mask" not in keys:
        raise MicroBatchPlanError(
            f"cannot find sequence lengths: the batch has neither a nested 'input_ids' nor an 'attention_mask' "
            f"(keys: {sorted(map(str, keys))})",
            MicroBatchPlanError.BAD_BATCH,
        )
    mask = batch.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise MicroBatchPlanError(
            f"attention_mask must be 2-D (batch, seq_len), got shape {shape}", MicroBatchPlanError.BAD_BATCH
        )
    if mask.dtype == torch.bool and mask.device.type == "cpu":
        # Summing a bool tensor on the CPU takes a slow path in torch (about 10x NumPy's count
        # of non-zeros, measured at 4096 x 4096 in benchmarks/breakdown.py); same result.
        return torch.from_numpy(np.count_nonzero(mask.detach().numpy(), axis=-1).astype(np.int64))
    return mask.sum(-1, dtype=torch.int64)


def rearrange_micro_batches(
    batch: TensorDict,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> tuple[list[TensorDict], list[list[int]]]:
    """Split ``batch`` into micro-batches of at most ``max_token_len`` effective tokens each.

    Drop-in for verl's ``rearrange_micro_batches`` (same signature, plus ``force_group_size``),
    with the cap enforced as a hard limit. Effective lengths come from :func:`effective_lengths`;
    the decision is :func:`seqbal.plan.plan_micro_batches` (see it for every argument, guarantee and error).

    Args:
        batch: a TensorDict with batch size ``[B]`` holding a 2-D ``attention_mask`` or a nested
            (jagged) ``input_ids``; every entry (dense, nested, non-tensor) is carried along.
        max_token_len, dp_group, num_batches_divided_by, same_micro_num_in_dp,
        min_num_micro_batch, use_dynamic_bsz_balance, force_group_size: as in
            :func:`seqbal.plan.plan_micro_batches`.

    Returns:
        ``(micro_batches, indices)``: ``micro_batches[i]`` is ``batch`` indexed along dim 0 with
        ``indices[i]`` (ascending original sample indices). Concatenate per-sample outputs in
        this order and undo it with :func:`restore_dynamic_batch`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"attention_mask": torch.ones(8, 7, dtype=torch.long)}, batch_size=[8])
        >>> micro_batches, indices = rearrange_micro_batches(batch, max_token_len=8)
        >>> len(micro_batches), [mb.batch_size[0] for mb in micro_batches]
        (8, [1, 1, 1, 1, 1, 1, 1, 1])
    """
    indices = _plan(
        lambda: effective_lengths(batch),
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
    )
    micro_batches = [select_rows(batch, part) for part in indices]
    return micro_batches, indices


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse of a permutation: ``out[idx_map[i]] = i``. O(n).

    Raises:
        ValueError: ``idx_map`` is not a permutation of ``range(len(idx_map))``.

    Examples:
        >>> get_reverse_idx([2, 0, 1])
        [1, 2, 0]
    """
    order = np.asarray(list(idx_map), dtype=np.int64)
    n = len(order)
    if n and (order.min() < 0 or order.max() >= n or len(np.unique(order)) != n):
        raise ValueError(f"idx_map must be a permutation of 0..{n - 1}, got {list(idx_map)[:20]}")
    reverse = np.empty(n, dtype=np.int64)
    reverse[order] = np.arange(n)
    return reverse.tolist()


def restore_dynamic_batch(
    data: Union[torch.Tensor, TensorDict], batch_idx_list: Sequence[Sequence[int]]
) -> Union[torch.Tensor, TensorDict]:
    """Put per-sample outputs back in the original sample order.

    ``data`` is the concatenation (along dim 0) of the per-micro-batch outputs in the order of
    ``batch_idx_list``, as returned by :func:`rearrange_micro_batches`: a dense tensor, a jagged
    nested tensor, or a TensorDict. Returns the same kind, row ``j`` being original sample ``j``.
    O(n) rows copied.

    Raises:
        ValueError: the number of rows of ``data`` differs from the number of indices.

    Examples:
        >>> restore_dynamic_batch(torch.tensor([30, 10, 20]), [[2], [0, 1]]).tolist()
        [10, 20, 30]
    """
    indices = list(chain.from_iterable(batch_idx_list))
    is_tensor = isinstance(data, torch.Tensor)
    rows = data.shape[0] if is_tensor else data.batch_size[0]
    if len(indices) != rows:
        raise ValueError(f"data has {rows} rows but batch_idx_list holds {len(indices)} indices")
    reverse = get_reverse_idx(indices)
    if not is_tensor:
        return select_rows(data, reverse)
    if data.is_nested:
        return select_nested_rows(data, reverse)
    return data[torch.as_tensor(reverse, dtype=torch.long, device=data.device)]
