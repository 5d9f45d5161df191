"""Select rows of any TensorDict a trainer builds, on every tensordict version seqbal declares.

``batch[index_tensor]`` is the obvious way to cut a micro-batch out of a TensorDict, but up to
tensordict 0.15.2 it raises ``NotImplementedError: aten.index.Tensor`` as soon as one entry is a
jagged nested tensor, which is exactly what verl's no-padding engine path builds (nested
``input_ids``, and ``(bs, 4, j)`` mRoPE ``position_ids`` whose ragged dimension is 2). So rows
are selected here entry by entry, with operations every supported version has:

- dense tensors: ``index_select`` on dim 0;
- jagged nested tensors: one gather of the selected rows' slices of ``values()`` along the
  ragged dimension and new offsets, then ``nested_tensor_from_jagged`` (the same layout and
  ragged dimension; no per-row Python loop, so the cost is one copy of the selected tokens);
- ``NonTensorStack``: its own indexing (one Python object per row); ``NonTensorData`` (one value
  for the whole batch, e.g. verl's ``max_token_len_per_gpu``): the same value, re-wrapped with
  the new batch size;
- nested TensorDicts: recursively, with the same rules.

The cost is one pass over the entries and one copy of the selected data, as for ``batch[idx]``.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

__all__ = ["select_rows", "select_nested_rows"]

Indices = Union[Sequence[int], torch.Tensor]


def _as_index(indices: Indices) -> torch.Tensor:
    """The row indices as a 1-D int64 CPU tensor (moved to an entry's device where it is used)."""
    index = torch.as_tensor(indices, dtype=torch.long).cpu()
    if index.dim() != 1:
        raise ValueError(f"row indices must be 1-D, got shape {tuple(index.shape)}")
    return index


def select_nested_rows(tensor: torch.Tensor, indices: Indices) -> torch.Tensor:
    """Rows ``indices`` of a jagged nested tensor, as a new jagged nested tensor.

    Works for any ragged dimension (``(B, j)``, ``(B, j, d)``, ``(B, 4, j)``) and keeps it, the
    dtype and the device. A nested tensor with holes (non-contiguous ``lengths``) or of the
    strided layout is rebuilt from its rows. O(selected tokens) copied.

    Raises:
        ValueError: an index out of range, or indices that are not 1-D.

    Examples:
        >>> nt = torch.nested.as_nested_tensor([torch.arange(n) for n in [3, 1, 2]], layout=torch.jagged)
        >>> [row.tolist() for row in select_nested_rows(nt, [2, 0]).unbind()]
        [[0, 1], [0, 1, 2]]
    """
    rows = tensor.size(0)
    index = _as_index(indices)
    if index.numel() and (int(index.min()) < -rows or int(index.max()) >= rows):
        raise ValueError(f"row index out of range for a nested tensor of {rows} rows: {index.tolist()[:20]}")
    index = index % max(rows, 1)
    if tensor.layout != torch.jagged or tensor._lengths is not None:
        pieces = tensor.unbind()
        return torch.nested.as_nested_tensor([pieces[i] for i in index.tolist()], layout=tensor.layout)
    ragged_dim = tensor._ragged_idx
    offsets = tensor.offsets()
    cpu_offsets = offsets.cpu().numpy()
    rows_index = index.numpy()
    starts = cpu_offsets[:-1][rows_index]
    lengths = (cpu_offsets[1:] - cpu_offsets[:-1])[rows_index]
    new_offsets = np.zeros(len(rows_index) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    # Position p of the output comes from starts[row] + (p - new_offsets[row]). NumPy's repeat:
    # torch.repeat_interleave with output_size was ~100x slower here (torch 2.13, CPU).
    source = np.arange(new_offsets[-1], dtype=np.int64) + np.repeat(starts - new_offsets[:-1], lengths)
    values = tensor.values()
    selected = values.index_select(ragged_dim - 1, torch.from_numpy(source).to(values.device))
    return torch.nested.nested_tensor_from_jagged(
        selected, torch.from_numpy(new_offsets).to(device=offsets.device, dtype=offsets.dtype), jagged_dim=ragged_dim
    )


def select_rows(batch: TensorDict, indices: Indices) -> TensorDict:
    """Rows ``indices`` (along dim 0) of ``batch``: what ``batch[indices]`` means, on every version.

    Every entry is kept: dense and jagged nested tensors (any ragged dimension), ``NonTensorStack``
    (one object per row), ``NonTensorData`` (one value for the batch, carried unchanged) and
    nested TensorDicts (recursively), and so are the batch's dim ``names``. The result has batch size ``[len(indices)]``, the batch's
    device, and owns its data (a copy, as ``batch[index_tensor]`` gives).
    O(selected data) copied plus O(number of entries).

    Raises:
        ValueError: ``batch`` has no batch dimension, or the indices are not 1-D.

    Examples:
        >>> ids = torch.nested.as_nested_tensor([torch.arange(n) for n in [5, 3, 7]], layout=torch.jagged)
        >>> batch = TensorDict({"input_ids": ids, "score": torch.tensor([0.5, 0.3, 0.7])}, batch_size=[3])
        >>> picked = select_rows(batch, [2, 0])
        >>> picked["input_ids"].offsets().tolist(), picked["score"].tolist()
        ([0, 7, 12], [0.699999988079071, 0.5])
    """
    if len(batch.batch_size) == 0:
        raise ValueError("cannot select rows of a TensorDict with an empty batch_size")
    device = batch.device
    index = _as_index(indices)
    rows = len(index)
    selected = {}
    for key in batch.keys():
        selected[key] = _select_entry(batch.get(key), index, rows)
    out = TensorDict(selected, batch_size=[rows, *batch.batch_size[1:]], device=device)
    if _has_names(batch):  # dim names ("batch", ...) travel with the rows, as batch[idx] keeps them
        out.rename_(*batch.names)
    return out


def _has_names(batch: TensorDict) -> bool:
    has_names = getattr(batch, "_has_names", None)
    return bool(has_names()) if callable(has_names) else any(name is not None for name in batch.names)


def _select_entry(value, index: torch.Tensor, rows: int):
    # NonTensorData and NonTensorStack are TensorDict-like too: test them before TensorDict.
    if isinstance(value, NonTensorData):
        return NonTensorData(data=value.data, batch_size=[rows, *value.batch_size[1:]], device=value.device)
    if isinstance(value, NonTensorStack):
        return value[index]
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return select_nested_rows(value, index)
        return value.index_select(0, index.to(value.device))
    if isinstance(value, TensorDict):
        return select_rows(value, index)
    # Any other tensor collection (a tensorclass, a lazy stack) indexes itself.
    return value[index.to(value.device) if getattr(value, "device", None) is not None else index]
