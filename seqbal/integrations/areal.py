"""Make a running AReaL micro-batch with seqbal: one call, :func:`install`, and :func:`uninstall`.

AReaL 1.0.4 splits every training batch with ``areal.utils.data.split_padded_tensor_dict_into_mb_list``
(the FSDP, Megatron and Archon engines, the PPO actor and critic), which looks up
``allocate_balanced_mbs_synced(mb_spec, lens, group=None)`` as a module global. AReaL's own
agrees on the count by repeated ``all_gather_object`` (one more gather per disagreement), and an
over-cap sample on one rank raises ``RuntimeError`` there while its peers wait in the gather
until the process-group timeout.

:func:`install` rebinds ``allocate_balanced_mbs_synced`` in ``areal.utils.data`` and, by
identity, in every loaded module that copied it (AReaL 1.0.4 has none; a user's
``from areal.utils.data import allocate_balanced_mbs_synced`` is reached too) to
:func:`allocate_balanced_mbs_synced`, which plans with :func:`seqbal.plan_micro_batches`:
``mb_spec.max_tokens_per_mb`` is the hard cap, ``mb_spec.n_mbs`` the minimum count,
``mb_spec.n_mbs_divisor`` the divisor, and ``group=None`` the default group (as AReaL's
``all_gather_object`` takes it) once torch.distributed is initialised. Two all-reduces, and an
error on any rank is a ``ValueError`` on every rank. ``mb_spec.packing_algorithm`` ("ffd",
"kk") is not used: seqbal's partitioner replaces both.

The order: AReaL runs the micro-batches in the order of the returned list (its engines iterate
``MicroBatchList.mbs``, built in that order, and put the outputs back in sample order with
``backward_indices``), so the order is seqbal's to choose. AReaL's own function returns them
sorted by their first index; so does seqbal by default (``micro_batch_order=None``).
``"pipeline"`` or ``"largest_first"`` (:mod:`seqbal.order`) make the plan order them instead,
and the ranks compare the order with the plan's other arguments.

AReaL is imported only when :func:`install` runs; without it, ``install()`` raises an
``ImportError`` that says so. :func:`uninstall` restores AReaL's function wherever seqbal's
wrapper is still bound.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, ContextManager, Optional, Sequence

from ._patching import Patch, apply_all, installed_while, undo_all
from ._settings import PlanSettings

__all__ = ["install", "uninstall", "installed", "is_installed", "allocate_balanced_mbs_synced"]

#: The AReaL module whose function seqbal replaces, and the function's name.
AREAL_MODULE = "areal.utils.data"
_NAME = "allocate_balanced_mbs_synced"

_patches: list[Patch] = []
_wrappers: dict[str, Any] = {}
# What install() was given: forwarded to every plan the installed function makes.
_settings: list[PlanSettings] = [PlanSettings()]


def _wrapper() -> Any:
    if _NAME not in _wrappers:
        _wrappers[_NAME] = functools.wraps(allocate_balanced_mbs_synced)(
            lambda *args, **kwargs: allocate_balanced_mbs_synced(*args, **_settings[0].merged(kwargs))
        )
    return _wrappers[_NAME]


def install(*, workload_fn: Optional[Any] = None, micro_batch_order: Optional[str] = None) -> list[tuple[str, str]]:
    """Make the running AReaL plan its micro-batches with seqbal. Idempotent. Call it in every
    training process (each engine rank) before training. O(loaded modules x their attributes).

    Args:
        workload_fn: what every plan balances (lengths -> non-negative workloads, see
            :func:`seqbal.plan_micro_batches`); default None: :func:`seqbal.calculate_workload`.
            Every rank must install the same model. A later ``install`` replaces it.
        micro_batch_order: the order in which AReaL runs each batch's micro-batches: None
            (default) AReaL's own, sorted by first index; ``"pipeline"`` (light ones at both
            ends) or ``"largest_first"`` (the most tokens first, so the caching allocator
            reserves its largest blocks once). The same on every rank.

    Returns:
        the ``(module, attribute)`` pairs that now point to seqbal.

    Raises:
        ImportError: AReaL is not installed (or ``areal.utils.data`` fails to import).
        ValueError: ``workload_fn`` is not a workload model, or ``micro_batch_order`` is not
            None, ``"pipeline"`` or ``"largest_first"``; nothing is patched then.

    Examples:
        >>> from seqbal.integrations import areal as seqbal_areal
        >>> seqbal_areal.install()  # doctest: +SKIP
        [('areal.utils.data', 'allocate_balanced_mbs_synced')]
    """
    settings = PlanSettings.checked(workload_fn, micro_batch_order, order_optional=True)
    try:
        module = importlib.import_module(AREAL_MODULE)
    except ImportError as error:
        raise ImportError(
            f"seqbal.integrations.areal needs AReaL (tested with areal 1.0.4): importing {AREAL_MODULE} failed "
            f"with {type(error).__name__}: {error}"
        ) from error
    _settings[0] = settings
    if not _patches and vars(module)[_NAME] is not _wrapper():
        _patches.append(Patch(module, _NAME, _wrapper(), everywhere=True))
    return apply_all(_patches)


def uninstall() -> list[tuple[str, str]]:
    """Undo :func:`install`; does nothing if seqbal is not installed.

    Returns:
        the ``(module, attribute)`` pairs that point to AReaL's function again.
    """
    changed = undo_all(_patches)
    _patches.clear()
    _settings[0] = PlanSettings()
    return changed


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_patches)


def installed(*, workload_fn: Optional[Any] = None,
              micro_batch_order: Optional[str] = None) -> ContextManager[list[tuple[str, str]]]:
    """``with installed(): ...`` runs the block with seqbal installed (with :func:`install`'s
    arguments), then uninstalls it (if it was not installed before the block)."""
    return installed_while(lambda: install(workload_fn=workload_fn, micro_batch_order=micro_batch_order),
                           uninstall, is_installed)


def allocate_balanced_mbs_synced(mb_spec: Any, lens: Sequence[int], group: Optional[Any] = None, *,
                                 workload_fn: Optional[Any] = None,
                                 micro_batch_order: Optional[str] = None) -> list[list[int]]:
    """AReaL's ``allocate_balanced_mbs_synced`` with seqbal's plan.

    Args:
        mb_spec: AReaL's ``MicroBatchSpec`` (any object with ``max_tokens_per_mb``, ``n_mbs``
            and ``n_mbs_divisor``): the cap, the minimum count (None: 1), the divisor
            (None: 1).
        lens: tokens of each unit to place (AReaL passes the sums of ``granularity`` adjacent
            sequences): a list, NumPy array or 1-D tensor.
        group: the ranks that must run the same count; None is the default group. Without an
            initialised torch.distributed, the plan is local.
        workload_fn: what the micro-batches balance (installed: :func:`install`'s); default
            None: :func:`seqbal.calculate_workload`.
        micro_batch_order: None (default): the micro-batches sorted by first index, as AReaL
            returns them; ``"pipeline"`` or ``"largest_first"``: in that order
            (:func:`seqbal.plan_micro_batches`), compared across the group (installed:
            :func:`install`'s).

    Returns:
        The micro-batches as ascending index lists into ``lens``, in run order; every one
        within the cap, the count equal on every rank of the group.

    Raises:
        ValueError: (:class:`seqbal.MicroBatchPlanError`) a unit over the cap, a count that
            cannot be formed, or an invalid spec (``max_tokens_per_mb`` missing or not a positive
            int, ``n_mbs`` or ``n_mbs_divisor`` not a positive int, an unknown
            ``micro_batch_order``, ranks that passed different orders), on any rank: every rank
            raises together. Nothing of ``mb_spec`` or ``lens`` is read outside the agreement.

    Examples:
        >>> from types import SimpleNamespace
        >>> spec = SimpleNamespace(max_tokens_per_mb=8, n_mbs=1, n_mbs_divisor=2)
        >>> allocate_balanced_mbs_synced(spec, [3, 5, 2, 6])
        [[0, 1], [2, 3]]
        >>> allocate_balanced_mbs_synced(spec, [3, 5, 2, 6], micro_batch_order="largest_first")
        [[2, 3], [0, 1]]
    """
    from ..plan import plan_micro_batches

    dp_group = group
    if group is None:
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch ships torch.distributed
            dist = None
        if dist is not None and dist.is_available() and dist.is_initialized():
            dp_group = dist.group.WORLD
    from ..plan import MicroBatchPlanError

    # getattr, not mb_spec.max_tokens_per_mb: a spec without a field on one rank must reach the
    # agreement (as an invalid cap, None) instead of raising AttributeError while its peers wait.
    cap = getattr(mb_spec, "max_tokens_per_mb", None)
    n_mbs = getattr(mb_spec, "n_mbs", None)
    divisor = getattr(mb_spec, "n_mbs_divisor", None)
    ordered = micro_batch_order is not None
    try:
        parts = plan_micro_batches(
            lens, cap, dp_group=dp_group, num_batches_divided_by=divisor, min_num_micro_batch=n_mbs,
            use_dynamic_bsz_balance=ordered, workload_fn=workload_fn,
            micro_batch_order=micro_batch_order if ordered else "pipeline",
        )
    except MicroBatchPlanError as error:
        raise MicroBatchPlanError(
            f"AReaL's micro-batch split (mb_spec.max_tokens_per_mb={cap!r}, n_mbs={n_mbs!r}, "
            f"n_mbs_divisor={divisor!r}): {error}",
            error.code,
        ) from error
    return [sorted(part) for part in parts] if ordered else sorted(parts)
