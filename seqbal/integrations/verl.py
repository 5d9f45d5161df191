"""Make a running verl micro-batch with seqbal: one call, :func:`install`, and :func:`uninstall`.

verl's engines (FSDP, Megatron, TorchTitan, VeOmni, AutoModel) micro-batch through
``verl.workers.engine.utils.prepare_micro_batches``, which calls the ``rearrange_micro_batches``
and ``restore_dynamic_batch`` it imported from ``verl.utils.seqlen_balancing``; the older
DataProto route calls that module's ``prepare_dynamic_batch``. A module that ran
``from verl.utils.seqlen_balancing import rearrange_micro_batches`` holds its own reference, so
patching the attribute of ``verl.utils.seqlen_balancing`` alone would miss it. :func:`install`
therefore replaces the function objects by identity in every loaded module that bound them
(and in ``verl.utils.seqlen_balancing``, so modules imported later bind seqbal's), and
:func:`uninstall` puts verl's back wherever seqbal's are bound, including in modules imported
after the install.

What is replaced: the micro-batching functions only (``rearrange_micro_batches``,
``restore_dynamic_batch``, ``get_reverse_idx``, ``prepare_dynamic_batch``). verl's balancing of
samples across data-parallel ranks (``get_seqlen_balanced_partitions`` in its trainer) is left
as it is.

verl is imported only when :func:`install` runs; without verl it raises an ``ImportError`` that
says so. :func:`prepare_dynamic_batch` and :func:`restore_dynamic_batch` work on any object
shaped like verl's ``DataProto`` (``batch``, ``non_tensor_batch``, ``meta_info``) and do not
import verl themselves.
"""

from __future__ import annotations

import copy
import functools
import importlib
from collections.abc import Mapping
from typing import Any, ContextManager, Optional

from ._patching import Patch, installed_while, undo_all
from ._settings import PlanSettings

import numpy as np

__all__ = [
    "install",
    "uninstall",
    "installed",
    "is_installed",
    "prepare_dynamic_batch",
    "restore_dynamic_batch",
]

#: The verl module whose micro-batching functions seqbal replaces.
VERL_MODULE = "verl.utils.seqlen_balancing"

#: The names in VERL_MODULE that seqbal replaces (see _replacements for what replaces each).
_REPLACED_NAMES = ("rearrange_micro_batches", "restore_dynamic_batch", "get_reverse_idx", "prepare_dynamic_batch")

# One Patch per replaced name, kept while installed so that uninstall() can undo exactly them.
_patches: list[Patch] = []
# The functions install() binds, by name: thin wrappers made once per process. Being objects of
# their own, they tell uninstall() exactly what install() put in place, so a module that
# imported seqbal's functions itself (``from seqbal import rearrange_micro_batches``) keeps them.
_wrappers: dict[str, Any] = {}
# What install() was given: forwarded to every plan the installed functions make.
_settings: list[PlanSettings] = [PlanSettings()]


def _replacements() -> dict[str, Any]:
    if not _wrappers:
        from .. import rearrange

        targets = {
            "rearrange_micro_batches": rearrange.rearrange_micro_batches,
            "restore_dynamic_batch": restore_dynamic_batch,
            "get_reverse_idx": rearrange.get_reverse_idx,
            "prepare_dynamic_batch": prepare_dynamic_batch,
        }
        for name, target in targets.items():
            if name in ("rearrange_micro_batches", "prepare_dynamic_batch"):  # they plan: install()'s settings
                _wrappers[name] = functools.wraps(target)(
                    lambda *args, _target=target, **kwargs: _target(*args, **_settings[0].merged(kwargs))
                )
            else:
                _wrappers[name] = functools.wraps(target)(
                    lambda *args, _target=target, **kwargs: _target(*args, **kwargs)
                )
    return _wrappers


def _import_verl_module():
    try:
        return importlib.import_module(VERL_MODULE)
    except ImportError as error:
        raise ImportError(
            f"seqbal.integrations.verl needs verl (tested with verl 0.9.1): importing {VERL_MODULE} failed "
            f"with {type(error).__name__}: {error}"
        ) from error


def install(*, workload_fn: Optional[Any] = None, micro_batch_order: str = "pipeline") -> list[tuple[str, str]]:
    """Make the running verl use seqbal wherever it micro-batches. Idempotent.

    Imports ``verl.utils.seqlen_balancing`` and replaces its ``rearrange_micro_batches``,
    ``restore_dynamic_batch``, ``get_reverse_idx`` and ``prepare_dynamic_batch`` with seqbal's,
    in that module and in every loaded module that imported them by name (for example
    ``verl.workers.engine.utils``). Call it once per process before training; for verl's Ray
    workers, see ``seqbal.integrations.verl_autoinstall``. O(loaded modules x their attributes).

    Args:
        workload_fn: what every micro-batch plan balances (lengths -> non-negative workloads,
            see :func:`seqbal.plan_micro_batches`); default None: :func:`seqbal.calculate_workload`.
            Every rank must install the same model (the plans compare it). A later
            ``install`` replaces it.
        micro_batch_order: ``"pipeline"`` (default, verl's ``use_dynamic_bsz_balance`` order)
            or ``"largest_first"``; verl's ``use_dynamic_bsz_balance=False`` still keeps the
            partitioner's order.

    Returns:
        the ``(module, attribute)`` pairs that now point to seqbal.

    Raises:
        ImportError: verl is not installed (or fails to import).
        ValueError: ``workload_fn`` is not a workload model, or ``micro_batch_order`` is unknown.

    Examples:
        >>> from seqbal.integrations import verl as seqbal_verl
        >>> seqbal_verl.install()  # doctest: +SKIP
        [('verl.utils.seqlen_balancing', 'rearrange_micro_batches'), ...]
    """
    settings = PlanSettings.checked(workload_fn, micro_batch_order)
    module = _import_verl_module()
    _settings[0] = settings
    replacements = _replacements()
    if not _patches:
        for name in _REPLACED_NAMES:
            original = vars(module).get(name)
            if original is not None and original is not replacements[name]:
                _patches.append(Patch(module, name, replacements[name], everywhere=True))
    changed: list[tuple[str, str]] = []
    for patch in _patches:
        changed.extend(patch.apply())
    return sorted(set(changed))


def uninstall() -> list[tuple[str, str]]:
    """Undo :func:`install`: verl's own functions are bound again wherever seqbal's are, also in
    modules imported after the install. A function that someone else bound after the install
    (another patch of verl's module) stays in place. Does nothing if seqbal is not installed.

    Returns:
        the ``(module, attribute)`` pairs that point to verl's functions again.
    """
    changed = undo_all(_patches)
    _patches.clear()
    _settings[0] = PlanSettings()
    return sorted(set(changed))


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_patches)


def installed(*, workload_fn: Optional[Any] = None, micro_batch_order: str = "pipeline") -> ContextManager[list[tuple[str, str]]]:
    """``with installed(): ...`` runs the block with seqbal installed (with :func:`install`'s
    arguments), then uninstalls it (if it was not installed before the block)."""
    return installed_while(lambda: install(workload_fn=workload_fn, micro_batch_order=micro_batch_order),
                           uninstall, is_installed)


def prepare_dynamic_batch(
    data: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    *,
    dummy_micro_batches: bool = False,
    workload_fn: Optional[Any] = None,
    micro_batch_order: str = "pipeline",
) -> tuple[list[Any], list[list[int]]]:
    """verl's ``prepare_dynamic_batch`` on a ``DataProto``, with seqbal's guarantees.

    Splits ``data.batch`` with :func:`seqbal.rearrange_micro_batches` (hard cap, few balanced
    micro-batches, data-parallel agreement in two all-reduces; see it for every argument and
    error, ``workload_fn`` and ``micro_batch_order`` included) and returns, for each micro-batch, a ``DataProto`` of the same class holding its rows
    of ``data.batch`` and of every ``data.non_tensor_batch`` array, and a deep copy of
    ``data.meta_info`` (as verl does). O(data copied) plus the plan.

    With ``dummy_micro_batches=True`` (sync mode) a rank short of samples gets dummy
    micro-batches: a ``DataProto`` of the rank's shortest sample (tensors and non-tensor rows
    alike) with the index list ``[]``; :func:`restore_dynamic_batch` drops their rows and
    :func:`seqbal.loss_weights` gives them zero weight.

    Returns:
        ``(micro_batches, indices)``; undo the order with :func:`restore_dynamic_batch`.

    Raises:
        ValueError: ``data.batch`` is None (no tensors to measure), ``data.non_tensor_batch`` is
            not a mapping of arrays with a row per sample, ``data.meta_info`` is not a mapping
            or cannot be deep-copied (a value holding a lock, say), or any error of
            :func:`seqbal.rearrange_micro_batches`. In sync mode each of these is agreed like
            that function's own errors: every rank of ``dp_group`` raises, none waits.
    """
    from ..plan import _plan
    from ..rearrange import rearrange_micro_batches

    # The same arguments for the report of a bad DataProto and for the plan: the agreement
    # compares them (dummy_micro_batches included), so a report made with others would meet
    # its peers as "different arguments" instead of as this rank's problem.
    arguments = dict(
        max_token_len=max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
        force_group_size=force_group_size,
        dummy_micro_batches=dummy_micro_batches,
        workload_fn=workload_fn,
        micro_batch_order=micro_batch_order,
    )
    problem = _data_problem(data)
    if problem is not None:
        # Through the same agreement as a bad batch: the peers, already in it, raise with this rank.
        def report() -> Any:
            raise problem

        _plan(report, **arguments)
        raise problem  # not reached: the plan raises the problem (or an argument error before it)
    batches, indices = rearrange_micro_batches(data.batch, **arguments)
    source = None
    if any(not part for part in indices):  # the rows rearrange copied into every dummy
        from ..plan import dummy_source
        from ..rearrange import effective_lengths

        source = dummy_source(effective_lengths(data.batch), force_group_size)
    data_class = type(data)
    micro_batches = []
    for batch, part in zip(batches, indices):
        rows = np.asarray(part if part else source, dtype=np.int64)
        non_tensors = {key: value[rows] for key, value in (data.non_tensor_batch or {}).items()}
        micro_batches.append(
            data_class(batch=batch, non_tensor_batch=non_tensors, meta_info=copy.deepcopy(data.meta_info))
        )
    return micro_batches, indices


def _data_problem(data: Any) -> Optional[Exception]:
    """What is wrong with a ``DataProto``-like ``data`` before it is split, or None: checked before
    the plan so that the error is agreed (a failure while cutting ``non_tensor_batch`` or copying
    ``meta_info`` after the plan would leave this rank alone while its peers train on). Every
    step after the plan only indexes what is checked here. O(keys + one copy of meta_info)."""
    from ..plan import MicroBatchPlanError

    def bad(message: str) -> MicroBatchPlanError:
        return MicroBatchPlanError(message, MicroBatchPlanError.BAD_BATCH)

    batch = getattr(data, "batch", None)
    if batch is None:
        return bad(
            f"prepare_dynamic_batch needs data.batch (a TensorDict with input_ids/attention_mask), got None "
            f"(data is a {type(data).__name__})"
        )
    rows = batch.batch_size[0] if getattr(batch, "batch_dims", 0) >= 1 else None  # else the plan says why
    non_tensors = getattr(data, "non_tensor_batch", None)
    if non_tensors is not None and not isinstance(non_tensors, Mapping):
        return bad(f"data.non_tensor_batch must be a dict of arrays, got a {type(non_tensors).__name__}")
    for key, value in (non_tensors or {}).items():
        length = len(value) if hasattr(value, "__len__") and hasattr(value, "__getitem__") else None
        if not isinstance(value, np.ndarray) or value.ndim < 1 or (rows is not None and length != rows):
            shape = tuple(value.shape) if isinstance(value, np.ndarray) else type(value).__name__
            return bad(
                f"data.non_tensor_batch[{key!r}] must be a NumPy array with a row per sample "
                f"({rows} rows, as data.batch), got {shape}"
            )
    meta_info = getattr(data, "meta_info", None)
    if meta_info is not None and not isinstance(meta_info, Mapping):
        return bad(f"data.meta_info must be a dict, got a {type(meta_info).__name__}")
    try:  # every micro-batch gets a deep copy (as verl's own does): try one here, before the plan
        copy.deepcopy(meta_info)
    except Exception as error:  # noqa: BLE001 - whatever deepcopy raises is this rank's problem
        keys = [key for key, value in meta_info.items() if not _deep_copies(value)] if meta_info else []
        return bad(
            f"data.meta_info cannot be deep-copied ({type(error).__name__}: {error}); each micro-batch gets a "
            f"deep copy, as in verl, so every value must support copy.deepcopy (failing keys: {keys})"
        )
    return None


def _deep_copies(value: Any) -> bool:
    try:
        copy.deepcopy(value)
    except Exception:  # noqa: BLE001
        return False
    return True


def restore_dynamic_batch(data: Any, batch_idx_list: list[list[int]]) -> Any:
    """Put per-sample outputs back in the original order: seqbal's
    :func:`seqbal.restore_dynamic_batch` for tensors (dense, nested) and TensorDicts, and for a
    ``DataProto`` its ``batch`` and every ``non_tensor_batch`` array (``meta_info`` kept).
    O(n) rows copied.

    Raises:
        ValueError: the number of rows differs from the number of indices.
    """
    from .. import rearrange

    if not hasattr(data, "non_tensor_batch"):
        return rearrange.restore_dynamic_batch(data, batch_idx_list)
    order = [i for part in batch_idx_list for i in part]
    rows = len(data)
    if len(order) == rows:
        reverse = np.asarray(rearrange.get_reverse_idx(order), dtype=np.int64)
    else:  # the rows of dummy micro-batches are dropped (or the row count is wrong: an error)
        reverse = np.asarray(rearrange._skip_dummy_rows(batch_idx_list, order, rows), dtype=np.int64)
    batch = None if data.batch is None else rearrange.restore_dynamic_batch(data.batch, batch_idx_list)
    non_tensors = {key: value[reverse] for key, value in (data.non_tensor_batch or {}).items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=data.meta_info)
