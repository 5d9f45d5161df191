"""rearrange_micro_batches and the restore helpers: TensorDict in, micro-batches out.

The decision is made on plain effective lengths by :func:`seqbal.plan.plan_micro_batches`
(NumPy only, with the data-parallel agreement); this module adds what needs torch and
TensorDict: reading the effective lengths from a batch, copying each micro-batch out of it
once, and putting per-sample outputs back in the original order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .cost import CostModel, as_cost_model
from .plan import MicroBatchPlanError, _WindowedLengths, _as_flag, _plan, dummy_source
from .tensordict_compat import select_nested_rows, select_rows
from .validation import int_array, is_int

__all__ = [
    "effective_lengths",
    "rearrange_micro_batches",
    "get_reverse_idx",
    "restore_dynamic_batch",
    "padding_window",
    "padding_windows",
    "trim_to_window",
]


def effective_lengths(batch: TensorDict) -> torch.Tensor:
    """Effective (non-padding) token count of every sample of ``batch``, as an int64 tensor.

    If ``batch["input_ids"]`` is a jagged nested tensor, its per-sample lengths: ``lengths()``
    when it has them (a view with holes, e.g. from ``torch.nested.narrow`` or
    ``nested_tensor_from_jagged(..., lengths=...)``), else the differences of ``offsets()``.
    Otherwise ``batch["attention_mask"].sum(-1)`` of a 2-D mask, which must be bool or hold only
    0 and 1: a float mask of 0.999 or NaN, or an integer mask of 2, is not a count of tokens.
    Stays on the batch's device. O(B * S); the 0/1 check of a non-bool mask is one more pass
    (``aminmax``, plus an equality test for float masks). Measured on the CPU at 4096 x 8192
    (``python -m benchmarks.mask_check``, median of 7 repeats, 2 runs): the check costs 1.7-1.8x
    the count itself for an int64 mask (worst repeat 2.1x; about 40-70 ms), 0.1x for int32,
    1.0x for float32, and nothing for a bool mask, which is never checked.

    Raises:
        MicroBatchPlanError: ``batch`` is not a TensorDict (or mapping); neither a nested
            ``input_ids`` nor an ``attention_mask``; a strided (non-jagged) nested
            ``input_ids``; a mask that is not 2-D, not real-valued, not 0/1, or on the meta
            device.

    Examples:
        >>> mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
        >>> effective_lengths(TensorDict({"attention_mask": mask}, batch_size=[2])).tolist()
        [2, 1]
    """
    if not isinstance(batch, (TensorDictBase, Mapping)):
        raise MicroBatchPlanError(
            f"batch must be a TensorDict (or a mapping of tensors), got {_describe(batch)}",
            MicroBatchPlanError.BAD_BATCH,
        )
    keys = set(batch.keys())
    if "input_ids" in keys:
        input_ids = batch.get("input_ids")
        if isinstance(input_ids, torch.Tensor) and input_ids.is_nested:
            if input_ids.layout == torch.strided:
                raise MicroBatchPlanError(
                    f"input_ids is a nested tensor of layout {input_ids.layout}: seqbal reads per-sample lengths "
                    f"from jagged nested tensors only; build it with layout=torch.jagged "
                    f"(torch.nested.as_nested_tensor(rows, layout=torch.jagged))",
                    MicroBatchPlanError.BAD_BATCH,
                )
            _check_not_meta("input_ids", input_ids)
            # lengths() is None without holes (and absent on the oldest torch we support)
            lengths = input_ids.lengths() if hasattr(input_ids, "lengths") else None
            if lengths is None:
                return input_ids.offsets().diff().long()
            return lengths.long()
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
    _check_not_meta("attention_mask", mask)
    if mask.dtype == torch.bool:
        if mask.device.type == "cpu":
            # Summing a bool tensor on the CPU takes a slow path in torch (about 10x NumPy's count
            # of non-zeros, measured at 4096 x 4096 in benchmarks/breakdown.py); same result.
            return torch.from_numpy(np.count_nonzero(mask.detach().numpy(), axis=-1).astype(np.int64))
        return mask.sum(-1, dtype=torch.int64)
    _check_zero_one(mask)
    return mask.sum(-1, dtype=torch.int64)


def _describe(value: object) -> str:
    """``a Tensor of shape (4, 8)``, ``a dict with keys [...]``: what was passed, for messages."""
    kind = type(value).__name__
    if isinstance(value, torch.Tensor):
        return f"a {kind} of shape {tuple(value.shape)}"
    if isinstance(value, Mapping):
        return f"a {kind} with keys {sorted(map(str, value.keys()))[:10]}"
    return f"a {type(value).__module__}.{kind}" if type(value).__module__ != "builtins" else f"a {kind} ({value!r:.60})"


def _check_not_meta(name: str, tensor: torch.Tensor) -> None:
    if tensor.device.type == "meta":
        raise MicroBatchPlanError(
            f"{name} is on the meta device (shape {tuple(tensor.shape)}): it holds no values to count "
            f"tokens from; plan on the real batch",
            MicroBatchPlanError.BAD_BATCH,
        )


def _check_zero_one(mask: torch.Tensor) -> None:
    """A non-bool mask must hold only 0 and 1: anything else would be truncated or summed as counts."""
    if mask.is_complex():
        raise MicroBatchPlanError(
            f"attention_mask must be bool or hold only 0 and 1, got a complex mask of dtype {mask.dtype}",
            MicroBatchPlanError.BAD_BATCH,
        )
    if mask.numel() == 0:
        return
    low, high = torch.aminmax(mask)
    # NaN fails both comparisons; an integer mask within [0, 1] holds only 0 and 1.
    valid = bool(low >= 0) and bool(high <= 1)
    if valid and mask.is_floating_point():
        valid = bool(((mask == 0) | (mask == 1)).all())
    if not valid:
        bad = ~((mask == 0) | (mask == 1))
        row, column = (int(i) for i in bad.nonzero()[0])
        raise MicroBatchPlanError(
            f"attention_mask must be bool or hold only 0 and 1, got {_show(mask[row, column])} at "
            f"[{row}, {column}] (dtype {mask.dtype}, values from {_show(low)} to {_show(high)}); "
            f"convert it with mask.bool() if non-zero means a token",
            MicroBatchPlanError.BAD_BATCH,
        )


def _show(value: torch.Tensor) -> str:
    """One element as a user wrote it: ``0.999`` rather than float32's ``0.9990000128746033``."""
    number = value.item()
    return f"{number:.6g}" if isinstance(number, float) else repr(number)


def _indexable_batch(batch: object) -> None:
    """``rearrange_micro_batches`` indexes ``batch`` along dim 0: reject what cannot be indexed
    that way before any planning (in sync mode, before the first all-reduce, so the failure is
    agreed instead of raised on this rank alone after its peers returned)."""
    if not isinstance(batch, TensorDictBase):
        raise MicroBatchPlanError(
            f"batch must be a tensordict.TensorDict with batch_size [B], got {_describe(batch)}; wrap the "
            f"tensors with TensorDict(data, batch_size=[B]) or plan on lengths with plan_micro_batches",
            MicroBatchPlanError.BAD_BATCH,
        )
    if batch.batch_dims < 1:
        raise MicroBatchPlanError(
            f"batch must have a batch dimension (batch_size [B]) to be split along, got batch_size "
            f"{list(batch.batch_size)}; build it with TensorDict(data, batch_size=[B])",
            MicroBatchPlanError.BAD_BATCH,
        )


def _batch_lengths(batch: TensorDict, trim_padding: Any = False, cost_model: Any = None) -> Any:
    """The lengths the plan needs, every check of ``batch`` made first (inside the agreement).

    With ``trim_padding``, every entry to be trimmed must have one sequence axis
    (:func:`_trim_axes`); under the padded cost the plan also gets each sample's window, since a
    trimmed micro-batch costs ``samples x`` its window, not ``samples x longest``.
    """
    _indexable_batch(batch)
    lengths = effective_lengths(batch)
    if not _as_flag("trim_padding", trim_padding) or not _has_mask_to_trim(batch):
        return lengths
    mask = batch.get("attention_mask")
    _trim_axes(batch, mask.shape[1])
    if not as_cost_model(cost_model).padded:  # validated by the plan before this runs
        return lengths
    starts, stops = _row_windows(mask)
    return _WindowedLengths(lengths, starts, stops)


def _has_mask_to_trim(batch: TensorDictBase) -> bool:
    """Trimming cuts the columns of a 2-D ``attention_mask``; a batch measured by a nested
    ``input_ids`` has no padding to cut."""
    input_ids = batch.get("input_ids") if "input_ids" in batch.keys() else None
    if isinstance(input_ids, torch.Tensor) and input_ids.is_nested:
        return False
    return "attention_mask" in batch.keys()


def _row_windows(mask: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first token column and last token column + 1, ``(width, 0)`` for a row without
    tokens, as int64 NumPy arrays. O(B*S)."""
    present = mask.detach().to("cpu").bool().numpy()
    width = present.shape[1]
    has = present.any(axis=1)
    first = present.argmax(axis=1)
    last = width - present[:, ::-1].argmax(axis=1)
    return np.where(has, first, width).astype(np.int64), np.where(has, last, 0).astype(np.int64)


def _trim_axes(batch: TensorDictBase, width: int) -> dict[Any, int]:
    """For every dense tensor leaf of ``batch`` that has an axis (after the batch's) as long as
    the mask's ``width``: that axis, the one :func:`trim_to_window` cuts. Nested (jagged) and
    non-tensor entries, and tensors without such an axis, are left out. O(entries).

    Raises:
        MicroBatchPlanError: an entry with two or more such axes (``(B, 4, 4)`` mRoPE positions of a
            4-column mask, ``(B, S, S)`` biases): which one holds the sequence cannot be told.
    """
    axes = {}
    dims = batch.batch_dims
    for key in batch.keys(include_nested=True, leaves_only=True):
        value = batch.get(key)
        if not isinstance(value, torch.Tensor) or value.is_nested:
            continue
        found = [axis for axis in range(max(dims, 1), value.dim()) if value.shape[axis] == width]
        if len(found) > 1:
            raise MicroBatchPlanError(
                f"trim_padding cannot tell which axis of {key!r} (shape {tuple(value.shape)}) holds the sequence: "
                f"axes {found} are all as long as the attention_mask's {width} columns; pad the batch to "
                f"another width or leave trim_padding off",
                MicroBatchPlanError.BAD_BATCH,
            )
        if found:
            axes[key] = found[0]
    return axes


def rearrange_micro_batches(
    batch: TensorDict,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    cost_model: Union[None, str, CostModel] = None,
    trim_padding: bool = False,
    *,
    dummy_micro_batches: bool = False,
    max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[Callable[[Any], Any]] = None,
    micro_batch_order: str = "pipeline",
) -> tuple[list[TensorDict], list[list[int]]]:
    """Split ``batch`` into micro-batches of at most ``max_token_len`` effective tokens each.

    Drop-in for verl 0.9.1's ``rearrange_micro_batches`` (its signature, plus ``cost_model``,
    ``trim_padding`` and the keyword-only ``dummy_micro_batches``), with the cap enforced as a
    hard limit. Effective lengths come from :func:`effective_lengths`;
    the decision is :func:`seqbal.plan.plan_micro_batches` (see it for every argument, guarantee and error).

    Args:
        batch: a TensorDict with batch size ``[B]`` holding a 2-D ``attention_mask`` or a nested
            (jagged) ``input_ids``; every entry (dense, nested, non-tensor) is carried along.
        max_token_len, dp_group, num_batches_divided_by, same_micro_num_in_dp,
        min_num_micro_batch, use_dynamic_bsz_balance, force_group_size, cost_model: as in
            :func:`seqbal.plan.plan_micro_batches`. Use ``cost_model="padded"`` when the
            forward runs on padded micro-batches (``samples x longest`` is then what the cap
            bounds).
        trim_padding: cut each micro-batch's padding columns (:func:`trim_to_window`), so a
            padded forward does not pay for the whole batch's width; outputs as wide as the
            trimmed micro-batch go back with :func:`restore_dynamic_batch` and ``windows``.
            Needs a 2-D ``attention_mask`` (a batch of nested ``input_ids`` has no padding to
            trim). Under ``cost_model="padded"`` a micro-batch then costs ``samples x`` its
            trimmed window (first to last token of any of its samples), so the cap bounds the
            trimmed tensors also with both sides padded or masks with holes. Default False.
        dummy_micro_batches: in sync mode, a rank with fewer groups than the agreed count gets
            it anyway, the missing micro-batches being dummies at the end: each a copy of the
            rank's shortest sample (its cheapest forced group when ``force_group_size > 1``,
            see :func:`seqbal.plan.dummy_source`), every key included so any model runs it,
            with an empty index list ``[]``. Give them zero loss weight
            (:func:`seqbal.loss_weights` does); :func:`restore_dynamic_batch` drops their
            outputs. Default False (a short rank is a ``Cannot satisfy`` error on every rank).
        max_samples_per_micro_batch: a second hard cap, on the samples of every micro-batch
            (a forced group counts ``force_group_size``); see :func:`seqbal.plan_micro_batches`.
            Default None (no cap).
        workload_fn: what the micro-batches balance (lengths -> non-negative workloads);
            default None: :func:`seqbal.calculate_workload`. See
            :func:`seqbal.plan_micro_batches`; the same model on every rank of ``dp_group``.
        micro_batch_order: ``"pipeline"`` (default) or ``"largest_first"``, as in
            :func:`seqbal.plan_micro_batches`; the same on every rank of ``dp_group``.

    Returns:
        ``(micro_batches, indices)``: ``micro_batches[i]`` is ``batch`` indexed along dim 0 with
        ``indices[i]`` (ascending original sample indices; ``[]`` for a dummy). Concatenate
        per-sample outputs in this order and undo it with :func:`restore_dynamic_batch`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict, TensorDictBase
        >>> batch = TensorDict({"attention_mask": torch.ones(8, 7, dtype=torch.long)}, batch_size=[8])
        >>> micro_batches, indices = rearrange_micro_batches(batch, max_token_len=8)
        >>> len(micro_batches), [mb.batch_size[0] for mb in micro_batches]
        (8, [1, 1, 1, 1, 1, 1, 1, 1])
    """
    measured: list[Any] = []  # the lengths the plan read, for the dummies' source

    def read_lengths() -> Any:
        measured.append(_batch_lengths(batch, trim_padding, cost_model))
        return measured[-1]

    indices = _plan(
        read_lengths,
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        force_group_size,
        cost_model,
        dummy_micro_batches,
        max_samples_per_micro_batch,
        workload_fn,
        micro_batch_order,
    )
    if any(not part for part in indices):
        read = measured[-1]
        source = dummy_source(read.lengths if isinstance(read, _WindowedLengths) else read, force_group_size, cost_model)
    else:
        source = None
    micro_batches = [select_rows(batch, part if part else source) for part in indices]
    if trim_padding and _has_mask_to_trim(batch):
        micro_batches = [trim_to_window(micro_batch) for micro_batch in micro_batches]
    return micro_batches, indices


def padding_window(attention_mask: torch.Tensor) -> tuple[int, int]:
    """Columns ``[start, stop)`` of a 2-D padding mask that hold a real token in some row.

    Right padding gives ``(0, longest)``, left padding ``(width - longest, width)``; a batch
    padded on both sides (left-padded prompts, right-padded responses) gives the span from the
    earliest first token to the latest last token. ``(0, 0)`` for a mask without tokens. O(B*S).

    Raises:
        ValueError: ``attention_mask`` is not a 2-D tensor.

    Examples:
        >>> padding_window(torch.tensor([[0, 1, 1, 0], [0, 0, 1, 0]]))
        (1, 3)
    """
    _check_mask_argument("attention_mask", attention_mask)
    columns = torch.nonzero(attention_mask.bool().any(0)).flatten()
    if columns.numel() == 0:
        return 0, 0
    return int(columns[0]), int(columns[-1]) + 1


def _check_mask_argument(name: str, mask: Any) -> None:
    if not isinstance(mask, torch.Tensor) or mask.is_nested or mask.dim() != 2:
        got = f"shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) and not mask.is_nested else _describe(mask)
        raise ValueError(f"{name} must be a 2-D (batch, seq_len) tensor, got {got}")


def padding_windows(batch: TensorDict, batch_idx_list: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """:func:`padding_window` of each micro-batch of ``batch``, from the untrimmed batch's mask:
    where each trimmed micro-batch's columns sat, for :func:`restore_dynamic_batch`. O(B*S).

    Examples:
        >>> batch = TensorDict({"attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}, batch_size=[2])
        >>> padding_windows(batch, [[1], [0]])
        [(0, 1), (0, 2)]
    """
    if not isinstance(batch, TensorDictBase) or "attention_mask" not in batch.keys():
        raise ValueError(f"padding_windows needs a TensorDict with an attention_mask, got {_describe(batch)}")
    mask = batch.get("attention_mask")
    return [padding_window(mask[torch.as_tensor(list(part), dtype=torch.long, device=mask.device)]) for part in batch_idx_list]


def trim_to_window(micro_batch: TensorDict) -> TensorDict:
    """Cut a micro-batch's padding columns: every dense entry with an axis as long as its
    ``attention_mask`` is wide (``input_ids``, ``position_ids``, mRoPE ``(B, 4, S)``
    ``position_ids``, the mask itself, nested TensorDicts included) keeps only the columns of
    :func:`padding_window` on that axis. Entries without such an axis (``responses``), nested
    (jagged) and non-tensor entries are kept as they are. Returns a new TensorDict. O(B*S).

    The trimmed width is the union of the samples' windows (the longest sample with one-sided
    padding); ``rearrange_micro_batches(..., cost_model="padded", trim_padding=True)`` plans so
    that ``samples x`` that width is within the cap.

    Raises:
        ValueError: ``micro_batch`` is not a TensorDict with a 2-D ``attention_mask``, or an
            entry has two axes of the mask's width (the sequence axis is ambiguous; the key is
            named).

    Examples:
        >>> batch = TensorDict({"attention_mask": torch.tensor([[0, 1, 1], [0, 0, 1]])}, batch_size=[2])
        >>> trim_to_window(batch)["attention_mask"].tolist()
        [[1, 1], [0, 1]]
    """
    if not isinstance(micro_batch, TensorDictBase) or "attention_mask" not in micro_batch.keys():
        raise ValueError(f"trim_to_window needs a TensorDict with an attention_mask, got {_describe(micro_batch)}")
    mask = micro_batch.get("attention_mask")
    _check_mask_argument("attention_mask", mask)
    width = mask.shape[1]
    start, stop = padding_window(mask)
    axes = _trim_axes(micro_batch, width)
    trimmed = micro_batch.clone(recurse=False)  # new containers, the same tensors: nothing is copied
    copied: set[tuple[str, ...]] = set()
    for key, axis in axes.items():
        path = key if isinstance(key, tuple) else (key,)
        for depth in range(1, len(path)):  # a nested TensorDict on the way: a container of our own
            prefix = path[:depth]
            if prefix not in copied:
                trimmed.set(prefix, trimmed.get(prefix).clone(recurse=False))
                copied.add(prefix)
        trimmed.set(key, micro_batch.get(key).narrow(axis, start, stop - start))
    return trimmed


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse of a permutation: ``out[idx_map[i]] = i``. O(n).

    Raises:
        ValueError: ``idx_map`` is not a permutation of ``range(len(idx_map))``.

    Examples:
        >>> get_reverse_idx([2, 0, 1])
        [1, 2, 0]
    """
    values = idx_map if isinstance(idx_map, np.ndarray) or isinstance(idx_map, torch.Tensor) else (
        list(idx_map) if isinstance(idx_map, Iterable) and not isinstance(idx_map, (str, bytes)) else idx_map)
    order = int_array(values, "idx_map", integral_floats=False, negative=True, sums=False)
    n = len(order)
    if n and (order.min() < 0 or order.max() >= n or len(np.unique(order)) != n):
        raise ValueError(f"idx_map must be a permutation of 0..{n - 1}, got {list(idx_map)[:20]}")
    reverse = np.empty(n, dtype=np.int64)
    reverse[order] = np.arange(n)
    return reverse.tolist()


def restore_dynamic_batch(
    data: Union[torch.Tensor, TensorDict, Sequence[torch.Tensor]],
    batch_idx_list: Sequence[Sequence[int]],
    *,
    windows: Optional[Sequence[tuple[int, int]]] = None,
    width: Optional[int] = None,
) -> Union[torch.Tensor, TensorDict]:
    """Put per-sample outputs back in the original sample order.

    ``data`` is the concatenation (along dim 0) of the per-micro-batch outputs in the order of
    ``batch_idx_list``, as returned by :func:`rearrange_micro_batches`: a dense tensor, a jagged
    nested tensor, or a TensorDict. Returns the same kind, row ``j`` being original sample ``j``.
    It may also be a list of one output per micro-batch (dense or jagged tensors, or
    TensorDicts), concatenated here. O(n) rows copied.

    Outputs of trimmed micro-batches (``trim_padding=True``) differ in width: pass them as a
    list, one dense tensor per micro-batch, with ``windows`` (:func:`padding_windows` of the
    untrimmed batch) and the full ``width``; each is put back at its columns of a zero tensor
    ``[B, width, ...]``.

    Dummy micro-batches (``dummy_micro_batches=True``, an empty index list) are dropped: in a
    list, their entries (and windows); concatenated, their rows, each dummy holding
    ``(rows - indices) / dummies`` of them (one, or ``force_group_size``). Concatenated
    outputs that already leave the dummies out are accepted too.

    Raises:
        ValueError: ``data`` is not a tensor, a TensorDict or a list of tensors (``None``, for
            one); the number of rows of ``data`` differs from the number of indices (plus a
            whole number of rows per dummy); a list of outputs of different widths without
            ``windows`` and ``width``, or an output whose width is not its window's.

    Examples:
        >>> restore_dynamic_batch(torch.tensor([30, 10, 20]), [[2], [0, 1]]).tolist()
        [10, 20, 30]
        >>> restore_dynamic_batch([torch.tensor([[7]]), torch.tensor([[5, 6]])], [[1], [0]],
        ...                       windows=[(0, 1), (0, 2)], width=3).tolist()
        [[5, 6, 0], [7, 0, 0]]
    """
    try:
        flat = list(chain.from_iterable(batch_idx_list))
        # ints only: int() alone would take 2.0 or True as an index
        if not all(is_int(i) or isinstance(i, torch.Tensor) and i.numel() == 1 and not i.is_floating_point()
                   and i.dtype != torch.bool for i in flat):
            raise TypeError
        indices = [int(i) for i in flat]
    except (TypeError, ValueError):
        raise ValueError(f"batch_idx_list must be a list of index lists (of ints), got {batch_idx_list!r:.80}") from None
    if isinstance(data, (list, tuple)):
        if any(not part for part in batch_idx_list) and len(data) == len(batch_idx_list):
            real = [position for position, part in enumerate(batch_idx_list) if part]
            data = [data[p] for p in real]
            windows = None if windows is None or len(windows) != len(batch_idx_list) else [windows[p] for p in real]
            batch_idx_list = [batch_idx_list[p] for p in real]
        if windows is None and width is None and _same_trailing_shape(data):
            data = _concatenate(data)
        else:
            data = _place_in_windows(data, batch_idx_list, windows, width)
    elif not isinstance(data, (torch.Tensor, TensorDictBase)):
        raise ValueError(
            f"data must be a tensor, a TensorDict or a list of per-micro-batch tensors, got {_describe(data)}"
        )
    is_tensor = isinstance(data, torch.Tensor)
    if (data.dim() if is_tensor else data.batch_dims) == 0:
        raise ValueError(f"data must have a row per sample along dim 0, got {_describe(data)} without dimensions")
    rows = data.shape[0] if is_tensor else data.batch_size[0]
    reverse = get_reverse_idx(indices) if len(indices) == rows else _skip_dummy_rows(batch_idx_list, indices, rows)
    if not is_tensor:
        return select_rows(data, reverse)
    if data.is_nested:
        return select_nested_rows(data, reverse)
    return data[torch.as_tensor(reverse, dtype=torch.long, device=data.device)]


def _skip_dummy_rows(batch_idx_list: Sequence[Sequence[int]], indices: list[int], rows: int) -> list[int]:
    """Row of each original sample in outputs that also hold the dummies' rows. O(rows)."""
    dummies = sum(1 for part in batch_idx_list if not part)
    extra = rows - len(indices)
    if not dummies or extra < 0 or extra % dummies:
        raise ValueError(
            f"data has {rows} rows but batch_idx_list holds {len(indices)} indices"
            + (f" and {dummies} dummy micro-batch(es), which would need the same number of rows each" if dummies else "")
        )
    per_dummy = extra // dummies
    positions, offset = [], 0
    for part in batch_idx_list:
        positions.extend(range(offset, offset + len(part)))
        offset += len(part) if part else per_dummy
    return [positions[k] for k in get_reverse_idx(indices)]


def _same_trailing_shape(outputs: Sequence[Any]) -> bool:
    """Whether per-micro-batch outputs can be concatenated as they are (no windows needed)."""
    shapes = {
        tuple(o.shape[1:]) if isinstance(o, torch.Tensor) and not o.is_nested else ("nested",) if isinstance(o, torch.Tensor)
        else ("tensordict",)
        for o in outputs
    }
    return len(shapes) <= 1


def _concatenate(outputs: Sequence[Any]) -> Union[torch.Tensor, TensorDict]:
    """One output per micro-batch, concatenated along dim 0 (jagged tensors row by row)."""
    if not outputs:
        raise ValueError("got no outputs to restore")
    first = outputs[0]
    if isinstance(first, torch.Tensor) and first.is_nested:
        return torch.nested.as_nested_tensor([row for o in outputs for row in o.unbind()], layout=torch.jagged)
    return torch.cat(list(outputs))


def _place_in_windows(
    outputs: Sequence[torch.Tensor],
    batch_idx_list: Sequence[Sequence[int]],
    windows: Optional[Sequence[tuple[int, int]]],
    width: Optional[int],
) -> torch.Tensor:
    """Per-micro-batch outputs of trimmed widths, each widened back to ``width`` at its window."""
    if windows is None or width is None:
        raise ValueError(
            "a list of per-micro-batch outputs needs windows= (seqbal.padding_windows of the untrimmed batch) "
            "and width= (its attention_mask.shape[1]) to put their columns back"
        )
    if not (len(outputs) == len(windows) == len(batch_idx_list)):
        raise ValueError(
            f"got {len(outputs)} outputs, {len(windows)} windows and {len(batch_idx_list)} micro-batches; "
            f"give one of each per micro-batch"
        )
    placed = []
    for position, (output, (start, stop)) in enumerate(zip(outputs, windows)):
        if not isinstance(output, torch.Tensor) or output.is_nested:
            raise ValueError(f"output {position} must be a dense tensor, got {_describe(output)}")
        if output.dim() < 2 or output.shape[1] != stop - start or stop > width:
            raise ValueError(
                f"output {position} has shape {tuple(output.shape)}, but its window ({start}, {stop}) needs "
                f"width {stop - start} in dimension 1 (within {width} columns)"
            )
        full = output.new_zeros((output.shape[0], width, *output.shape[2:]))
        full[:, start:stop] = output
        placed.append(full)
    return torch.cat(placed)
