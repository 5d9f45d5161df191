"""Make torchtitan's RL ``Batcher`` pack rows and the micro-batch grid with seqbal's schedule.

torchtitan 0.3.0's RL batcher (``torchtitan/experiments/rl/components/batcher.py``) turns a train
step's samples into ``[num_microbatches][dp_degree]`` ``TrainingMicrobatch``es of
``[local_batch_size, seq_len]``: it packs samples next-fit, in arrival order, into rows of at
most ``seq_len`` tokens, then deals the rows round-robin over the grid (its code carries a TODO
for best-fit and for balancing DP rows on a ``seq_len**2`` budget). Ranks then wait for each
other at every micro-batch, so a grid cell that is heavier than its peers on the other ranks
slows every rank.

:func:`install` replaces two methods of the ``Batcher`` class, and nothing else:

* ``_assign_training_samples_to_rows`` plans with :func:`plan_rows`: the rows are the
  micro-batches of :func:`seqbal.build_dp_schedule` over ``dp_degree * local_batch_size``
  row positions with ``max_token_len=seq_len`` (every row within ``seq_len``, as few rows as
  the schedule finds, every sample placed once), so each slot's rows carry similar work; the
  rows come back in grid order, cell after cell, pad rows (empty) included;
* ``_build_microbatch_grid`` lays those rows out contiguously: cell ``(m, r)`` is rows
  ``(m * dp_degree + r) * local_batch_size`` onwards. Every other method, the metrics, the
  group accounting and ``add_training_samples`` are torchtitan's own.

Samples longer than ``seq_len``: torchtitan's documented behaviour is kept. Its
``add_training_samples`` drops them before packing, with a warning and the metric
``batcher/num_samples_dropped_oversized``; seqbal never sees them. If a caller hands such a
sample to the row assignment directly, :func:`plan_rows` raises a ``ValueError`` naming it.

torchtitan is imported only by :func:`install`, and only the batcher module. Importing
``torchtitan.experiments.rl`` runs its ``__init__``, which registers models with vLLM; the
batcher itself needs neither vLLM nor triton, and :func:`plan_rows` needs neither torch nor
torchtitan. Where the package ``__init__`` cannot run (no vLLM), load ``batcher.py`` yourself
and pass its class: ``install(batcher_class=...)``.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Callable, ContextManager, Optional, Sequence

from ._patching import installed_while
from ._settings import PlanSettings

import numpy as np

__all__ = ["install", "uninstall", "installed", "is_installed", "plan_rows", "BATCHER_MODULE"]

#: The torchtitan module whose ``Batcher`` class is patched.
BATCHER_MODULE = "torchtitan.experiments.rl.components.batcher"

#: Methods of ``Batcher`` that install() replaces.
_REPLACED = ("_assign_training_samples_to_rows", "_build_microbatch_grid")

_originals: dict[str, Any] = {}  # torchtitan's own functions from the class __dict__, while installed
_state: dict[str, Any] = {}  # "class": the patched class, "settings": install()'s PlanSettings


def plan_rows(
    lengths: Sequence[int],
    seq_len: int,
    local_batch_size: int,
    dp_degree: int,
    *,
    workload_fn: Optional[Callable[[Any], Any]] = None,
    micro_batch_order: str = "pipeline",
) -> list[list[list[list[int]]]]:
    """The batcher's grid, planned: ``grid[m][r][b]`` lists the samples of row ``b`` of rank ``r``
    in micro-batch ``m``, shape ``[num_microbatches][dp_degree][local_batch_size]``.

    The rows are :func:`seqbal.build_dp_schedule`'s micro-batches with ``dp_size = dp_degree *
    local_batch_size`` row positions and ``max_token_len = seq_len``: every row holds at most
    ``seq_len`` tokens, every sample is in exactly one row, and slot ``m`` (micro-batch ``m``)
    carries similar work in every row position, hence in every rank's cell. When there are
    fewer samples than row positions to fill, the missing rows are pad rows (empty lists), as
    torchtitan pads. The number of micro-batches is the schedule's, ``>= 1``. Pure NumPy;
    deterministic. Cost: one :func:`seqbal.build_dp_schedule` call.

    Args:
        lengths: tokens each sample takes in a row (the batcher's ``num_tokens_to_pack``).
        seq_len: tokens per row.
        local_batch_size: rows per rank per micro-batch.
        dp_degree: data-parallel ranks.
        workload_fn: lengths -> workloads (default :func:`seqbal.calculate_workload`).
        micro_batch_order: the order of the micro-batches ``m``, the same in every cell:
            ``"pipeline"`` (default) or ``"largest_first"`` (see :func:`seqbal.build_dp_schedule`).

    Returns:
        The grid of sample indices (ascending within a row).

    Raises:
        ValueError: a sample longer than ``seq_len`` (torchtitan drops those before packing),
            or a non-positive ``seq_len``, ``local_batch_size`` or ``dp_degree``.

    Examples:
        >>> plan_rows([5, 5, 5], seq_len=10, local_batch_size=1, dp_degree=2)
        [[[[0]], [[1, 2]]]]
    """
    from ..schedule import build_dp_schedule
    from ..schedule.inputs import raise_if_over
    from ..validation import int_argument, int_array

    seq_len = int_argument("seq_len", seq_len)
    local_batch_size = int_argument("local_batch_size", local_batch_size)
    dp_degree = int_argument("dp_degree", dp_degree)
    array = int_array(lengths, "lengths", samples=True)
    raise_if_over(array, seq_len, lambda index, count: (
        f"sample {index} needs {int(array[index])} tokens, which exceeds seq_len={seq_len} "
        f"({count} sample(s) over): torchtitan's Batcher.add_training_samples drops such samples "
        f"before packing; raise seq_len or truncate them"
    ))
    positions = dp_degree * local_batch_size
    n = len(array)
    if n == 0:
        return [[[[] for _ in range(local_batch_size)] for _ in range(dp_degree)]]
    # Zero-token stand-ins up to a multiple of the row positions: a row that only holds
    # stand-ins is a pad row. The schedule's count comes from the tokens, never above
    # ceil(n / positions), so it always has enough groups to fill its rows.
    fillers = -(-n // positions) * positions - n
    padded = np.concatenate([array, np.zeros(fillers, dtype=np.int64)])
    schedule = build_dp_schedule(padded, positions, seq_len, workload_fn=workload_fn, micro_batch_order=micro_batch_order)
    grid = []
    for slot in range(schedule.num_micro_batches):
        rows = [[i for i in schedule.micro_batches[p][slot] if i < n] for p in range(positions)]
        grid.append([rows[r * local_batch_size:(r + 1) * local_batch_size] for r in range(dp_degree)])
    return grid


def _assign_training_samples_to_rows(self: Any, training_samples: list) -> list[list]:
    """seqbal's row assignment for torchtitan's ``Batcher``: rows in grid order, pad rows empty."""
    lengths = [self.num_tokens_to_pack(sample) for sample in training_samples]
    settings = _state.get("settings", PlanSettings())
    grid = plan_rows(lengths, self.seq_len, self.local_batch_size, self._dp_degree, **settings.keywords())
    return [[training_samples[i] for i in row] for cells in grid for cell in cells for row in cell]


def _build_microbatch_grid(self: Any, packed_rows: list[dict]) -> list[list[Any]]:
    """``[num_microbatches][dp_degree]`` from rows in grid order: cell ``(m, r)`` is the
    ``local_batch_size`` rows from ``(m * dp_degree + r) * local_batch_size`` (pad rows added
    at the end up to a full grid, in place, as torchtitan does)."""
    rows_per_microbatch = self.local_batch_size * self._dp_degree
    num_microbatches = max(1, math.ceil(len(packed_rows) / rows_per_microbatch))
    while len(packed_rows) < num_microbatches * rows_per_microbatch:
        packed_rows.append(self._pack_training_sample_row([]))
    size = self.local_batch_size
    return [
        [self.collate(packed_rows[(m * self._dp_degree + r) * size:(m * self._dp_degree + r + 1) * size])
         for r in range(self._dp_degree)]
        for m in range(num_microbatches)
    ]


_REPLACEMENTS = {
    "_assign_training_samples_to_rows": _assign_training_samples_to_rows,
    "_build_microbatch_grid": _build_microbatch_grid,
}


def _import_batcher_class() -> type:
    try:
        module = importlib.import_module(BATCHER_MODULE)
    except ImportError as error:
        raise ImportError(
            f"seqbal.integrations.torchtitan needs torchtitan's RL batcher (tested with torchtitan 0.3.0): "
            f"importing {BATCHER_MODULE} failed with {type(error).__name__}: {error}. Importing "
            f"torchtitan.experiments.rl runs its __init__, which imports vLLM; without vLLM, load batcher.py "
            f"yourself and call install(batcher_class=...)"
        ) from error
    return module.Batcher


def install(batcher_class: Optional[type] = None, *, workload_fn: Optional[Callable[[Any], Any]] = None,
            micro_batch_order: str = "pipeline") -> list[str]:
    """Make torchtitan's RL ``Batcher`` assign rows and the grid with seqbal. Idempotent.

    Args:
        batcher_class: the ``Batcher`` class to patch. Default: ``Batcher`` of
            :data:`BATCHER_MODULE`, imported here (which runs ``torchtitan.experiments.rl``'s
            ``__init__`` unless it is already loaded).
        workload_fn: lengths -> workloads the grid cells are balanced on (default
            :func:`seqbal.calculate_workload`, ``24576 * L + L**2``).
        micro_batch_order: the order of the grid's micro-batches: ``"pipeline"`` (default) or
            ``"largest_first"`` (:func:`plan_rows`).

    Returns:
        The names of the methods that now point to seqbal.

    Raises:
        ImportError: torchtitan (or its batcher module) cannot be imported.
        ValueError: seqbal is already installed on a different class; ``workload_fn`` is not a
            workload model or ``micro_batch_order`` is unknown.

    Examples:
        >>> from seqbal.integrations import torchtitan as seqbal_torchtitan
        >>> seqbal_torchtitan.install()  # doctest: +SKIP
        ['_assign_training_samples_to_rows', '_build_microbatch_grid']
    """
    settings = PlanSettings.checked(workload_fn, micro_batch_order)
    cls = batcher_class if batcher_class is not None else _import_batcher_class()
    patched = _state.get("class")
    if patched is not None and patched is not cls:
        raise ValueError(f"seqbal is installed on {patched!r} already; uninstall() it before patching {cls!r}")
    if patched is None:
        for name in _REPLACED:
            if name not in cls.__dict__:
                raise ValueError(f"{cls!r} has no method {name}: not torchtitan 0.3.0's Batcher")
            _originals[name] = cls.__dict__[name]
        _state["class"] = cls
    _state["settings"] = settings
    for name in _REPLACED:
        setattr(cls, name, _REPLACEMENTS[name])
    return list(_REPLACED)


def uninstall() -> list[str]:
    """Undo :func:`install`: torchtitan's own methods are back on the class, exactly the
    objects that were there before. Does nothing if seqbal is not installed.

    Returns:
        The names of the methods restored.
    """
    cls = _state.pop("class", None)
    _state.pop("settings", None)
    if cls is None:
        return []
    restored = []
    for name, original in _originals.items():
        if cls.__dict__.get(name) is _REPLACEMENTS[name]:  # leave anything patched after us alone
            setattr(cls, name, original)
            restored.append(name)
    _originals.clear()
    return restored


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return "class" in _state


def installed(batcher_class: Optional[type] = None, *, workload_fn: Optional[Callable[[Any], Any]] = None,
              micro_batch_order: str = "pipeline") -> ContextManager[list[str]]:
    """``with installed(): ...`` runs the block with seqbal installed, then uninstalls it (if it
    was not installed before the block)."""
    return installed_while(lambda: install(batcher_class, workload_fn=workload_fn, micro_batch_order=micro_batch_order),
                           uninstall, is_installed)
