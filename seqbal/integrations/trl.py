"""Make transformers' ``Trainer`` (so TRL's ``SFTTrainer``) train under a token budget: one
call, :func:`install`, and :func:`uninstall`.

transformers 5.24.0 and 5.25.0 build the training dataloader in ``Trainer._get_dataloader`` from
``Trainer._get_train_sampler``; a sampler that is a ``BatchRebalanceSampler`` is handed to the
``DataLoader`` as its *batch* sampler, and accelerate's re-sharding of it is turned off (it is
already rank-aware). :func:`install` rebinds ``Trainer._get_train_sampler`` to one that returns a
:class:`~seqbal.epochs.sampler.TokenBudgetBatchSampler` of a subclass that is also a
``BatchRebalanceSampler``, so it rides that hook unchanged: every micro-batch within
``max_token_len``, the same count on every rank (a multiple of
``gradient_accumulation_steps``), slot-balanced across ranks, no collective. That sampler
takes its epoch from ``floor(trainer.state.epoch)`` when the dataloader starts one
(accelerate's wrappers do not forward ``set_epoch``), so a run resumed mid-epoch forwards the
same remaining batches on every rank. A subclass of ``Trainer`` that overrides
``_get_train_sampler`` itself is left alone.

Lengths: the column ``args.length_column_name`` (default ``"length"``) of the dataset the
Trainer hands to the sampler when it is there (it survives only with
``remove_unused_columns=False``), else ``len(input_ids)`` of every row (TRL's packed rows
included). ``per_device_train_batch_size`` then no longer limits a micro-batch: it only enters
transformers' logged ``total_train_batch_size`` and sample-count estimates; a warning says so,
once.

Padding-free batches: the first dataloader also hooks the model's first training forward
(:mod:`seqbal.integrations._packed_attention`): where the batch is padding-free and transformers
would let the packed sequences attend to each other (a KV cache in training: ``use_cache=True``
without gradient checkpointing), it raises a ``ValueError`` on every rank before any update.

The loss: transformers counts ``num_items_in_batch`` (the label tokens of the step's
``gradient_accumulation_steps`` micro-batches, summed over ranks with ``average_tokens_across_devices``)
and divides every micro-batch's summed loss by it, so the accumulated gradient is the step's
token-mean loss however the tokens fall into micro-batches (tested gradient-exact).

Resume: transformers 5.25 skips the trained batches through ``Trainer.get_resumed_dataloader``
(accelerate's ``skip_first_batches`` by default), 5.24 calls ``skip_first_batches`` directly;
either way the batches of an epoch are a function of the seed and the epoch, so skipping ``k``
leaves exactly the rest, and seqbal needs to override neither.

transformers is imported only when :func:`install` runs; a transformers without
``BatchRebalanceSampler`` (before 5.24.0) is an ``ImportError`` that says so. :func:`uninstall`
restores transformers' method wherever seqbal's wrapper is still bound, and removes the forward
hooks still waiting for a first training batch.
"""

from __future__ import annotations

import importlib
import math
import warnings
import weakref
from typing import Any, Callable, ContextManager, Iterator, Optional, Union

from ._packed_attention import unwatch_all, watch_first_training_batch
from ._patching import Patch, apply_all, installed_while, undo_all
from ._settings import PlanSettings
from ..epochs.sampler import TokenBudgetBatchSampler, pack_rows

__all__ = [
    "install",
    "uninstall",
    "installed",
    "is_installed",
    "TokenBudgetBatchSampler",
    "pack_rows",
    "dataset_lengths",
]

#: The transformers module whose ``Trainer`` method seqbal replaces, and the method's name.
TRAINER_MODULE = "transformers.trainer"
_NAME = "_get_train_sampler"
#: The stacks the adapter is tested with.
TESTED = ("trl 1.16.0 and datasets 5.2.0 with transformers 5.25.0 and accelerate 1.16.0, or with transformers 5.24.0 "
          "and accelerate 1.15.0")

_patches: list[Patch] = []
_settings: dict[str, Any] = {}
_classes: dict[str, type] = {}
_warned: list[bool] = []


def dataset_lengths(dataset: Any, length_column: Optional[str] = "length", input_name: str = "input_ids") -> list[int]:
    """The tokens of every row of a training dataset: its ``length_column`` if it has one, else
    ``len(row[input_name])``. O(rows) (O(tokens) when read from ``input_ids``).

    Raises:
        ValueError: a row without ``input_name`` and no length column.
    """
    columns = getattr(dataset, "column_names", None)
    if columns is not None and length_column in columns:
        return [int(x) for x in dataset[length_column]]
    if columns is not None and input_name in columns:
        return [len(x) for x in dataset[input_name]]
    lengths = []
    for index in range(len(dataset)):
        row = dataset[index]
        if not hasattr(row, "keys") or input_name not in row:
            raise ValueError(
                f"seqbal's token-budget sampler needs every training row to have {input_name!r} (or the dataset a "
                f"{length_column!r} column); row {index} has {sorted(row) if hasattr(row, 'keys') else type(row).__name__}"
            )
        lengths.append(len(row[input_name]))
    return lengths


def _trainer_epoch(trainer: Any) -> Optional[int]:
    """The epoch a ``Trainer`` is in: ``floor(trainer.state.epoch)``, or None before training.

    transformers sets ``state.epoch = epoch + (step + 1) / steps_in_epoch`` after every step, so
    it is the integer ``e`` exactly when epoch ``e`` begins, and a checkpoint saved ``k`` steps into
    epoch ``e`` restores ``e + k / steps_in_epoch``, whose floor is ``e``. O(1)."""
    epoch = getattr(getattr(trainer, "state", None), "epoch", None)
    return None if epoch is None else int(math.floor(epoch))


class _FollowsTrainerEpoch:
    """Mixin: read the trainer's epoch when the dataloader starts an epoch.

    accelerate wraps the batch sampler (``BatchSamplerShard`` on more than one rank, and
    ``SkipBatchSampler`` around that when transformers resumes mid-epoch); neither forwards
    ``set_epoch``, so a resumed epoch ``e > 0`` would otherwise replay epoch 0's shuffle. Reading
    the epoch from the trainer at ``__iter__`` time needs no wrapper to cooperate: fresh epochs and
    resumed ones yield the batches of the epoch the trainer is in, on every rank."""

    _trainer: Optional[Callable[[], Any]] = None

    def __iter__(self) -> Iterator[list[int]]:
        epoch = _trainer_epoch(self._trainer()) if self._trainer is not None else None
        if epoch is not None:
            self.set_epoch(epoch)
        return super().__iter__()


def _sampler_class(base: type) -> type:
    """TokenBudgetBatchSampler that is also transformers' ``BatchRebalanceSampler``, so that
    ``Trainer._get_dataloader`` passes it as the batch sampler, and that follows the trainer's
    epoch (:class:`_FollowsTrainerEpoch`). Made once per process."""
    if "cls" not in _classes:
        _classes["cls"] = type("TrainerTokenBudgetBatchSampler", (_FollowsTrainerEpoch, TokenBudgetBatchSampler, base), {})
    return _classes["cls"]


def _trl_length_advice(args: Any, cap: int) -> str:
    """What to change in TRL's ``SFTConfig`` when a row is over the cap, or ``""``. O(1)."""
    if not hasattr(args, "padding_free"):
        return ""  # not an SFTConfig
    max_length = getattr(args, "max_length", None)
    if getattr(args, "packing", False) and max_length is not None and max_length > cap:
        return (f" TRL packs rows of up to SFTConfig.max_length={max_length} tokens: set max_length <= {cap}, or let "
                "seqbal group the samples instead (packing=False, padding_free=True, max_length=None).")
    if max_length is None:
        return (" SFTConfig(max_length=None) truncates nothing: drop or truncate the samples over the cap before "
                "training, or raise max_token_len.")
    return ""


def _first_dataloader_warning(args: Any, cost_model: Any) -> str:
    """The one warning of :func:`install`, at the first dataloader. O(1)."""
    message = (
        f"seqbal: per_device_train_batch_size={args.per_device_train_batch_size} no longer limits a micro-batch; "
        f"each holds at most max_token_len={_settings['max_token_len']} tokens "
        f"({'padded cost' if cost_model == 'padded' else 'token cost'}) and as many samples as fit. It only "
        "enters transformers' logged total_train_batch_size."
    )
    if hasattr(args, "padding_free") and not args.padding_free and not getattr(args, "packing", False):
        message += (" TRL pads every micro-batch to its longest sample here; SFTConfig(padding_free=True, "
                    "max_length=None) packs them instead (TRL 1.16 refuses padding_free=True with a max_length).")
    return message


def _get_train_sampler(self: Any, train_dataset: Any = None) -> Any:
    """``Trainer._get_train_sampler`` with seqbal's token-budget batch sampler; also watches the
    model's first training forward for packed sequences that would attend to each other."""
    dataset = self.train_dataset if train_dataset is None else train_dataset
    if dataset is None or not hasattr(dataset, "__len__"):
        return _patches[0].original(self, train_dataset) if _patches else None
    args = self.args
    collator = getattr(self, "data_collator", None)
    cost_model = _settings.get("cost_model")
    if cost_model is None:
        cost_model = None if getattr(collator, "padding_free", False) else "padded"
    if not _warned:
        _warned.append(True)
        warnings.warn(_first_dataloader_warning(args, cost_model), stacklevel=2)
    if getattr(self, "model", None) is not None:
        watch_first_training_batch(self.model)
    module = importlib.import_module("transformers.trainer_pt_utils")
    cap = _settings["max_token_len"]
    return sampler_for_trainer(
        _sampler_class(module.BatchRebalanceSampler), self,
        dataset_lengths(dataset, getattr(args, "length_column_name", "length")), cap,
        cost_model=cost_model, max_samples_per_micro_batch=_settings.get("max_samples_per_micro_batch"),
        advice=lambda: _trl_length_advice(args, cap), workload_fn=_settings.get("workload_fn"),
        micro_batch_order=_settings.get("micro_batch_order"),
    )


def sampler_for_trainer(
    sampler_class: type, trainer: Any, lengths: Any, max_token_len: int, *, cost_model: Any = None,
    max_samples_per_micro_batch: Optional[int] = None, shuffle: bool = True,
    advice: Optional[Callable[[], str]] = None, workload_fn: Optional[Callable[[Any], Any]] = None,
    micro_batch_order: Optional[str] = None,
) -> Any:
    """A :class:`TokenBudgetBatchSampler` (of ``sampler_class``, a subclass that follows the
    trainer's epoch) for a transformers ``trainer``: its ranks, rank, seed (``data_seed`` first)
    and ``gradient_accumulation_steps`` from ``trainer.args``. A sample over the cap is the
    sampler's ``ValueError``, with ``advice()`` (what to change in the trainer's own settings, or
    ``""``) appended where it says something; ``workload_fn`` is what its slots balance
    (default None: :func:`seqbal.calculate_workload`); ``micro_batch_order`` orders the slots of
    every optimizer step (default None: the sampler's random order). Both are compared across
    ranks with the sampler's other settings. Builds on every rank (one all-reduce where the
    ranks share the plan)."""
    args = trainer.args
    world = max(1, args.world_size)
    try:
        sampler = sampler_class(
            lengths,
            max_token_len,
            num_replicas=world,
            rank=args.process_index if world > 1 else 0,
            seed=args.data_seed if getattr(args, "data_seed", None) is not None else args.seed,
            shuffle=shuffle,
            cost_model=cost_model,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            max_samples_per_micro_batch=max_samples_per_micro_batch,
            workload_fn=workload_fn,
            micro_batch_order=micro_batch_order,
        )
    except ValueError as error:
        extra = advice() if advice is not None and "exceeds max_token_len" in str(error) else ""
        if not extra:
            raise
        raise ValueError(f"{str(error).rstrip('.')}.{extra}") from error
    sampler._trainer = weakref.ref(trainer)
    return sampler


def _positive_int(name: str, value: Any) -> int:
    """``value`` as an int if it is a positive Python or NumPy integer (not a bool), else a
    ``ValueError`` naming ``name``."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def checked_settings(
    max_token_len: Any, cost_model: Any, max_samples_per_micro_batch: Any, *, cap_optional: bool = False,
) -> tuple[Optional[int], Any, Optional[int]]:
    """An adapter's ``install()`` arguments checked before anything is imported or patched:
    ``(max_token_len, cost_model, max_samples_per_micro_batch)`` with the integers as Python ints.
    A ``ValueError`` names a bad one; ``cap_optional`` lets ``max_token_len`` be None. O(1)."""
    if max_token_len is not None or not cap_optional:
        max_token_len = _positive_int("max_token_len", max_token_len)
    if max_samples_per_micro_batch is not None:
        max_samples_per_micro_batch = _positive_int("max_samples_per_micro_batch", max_samples_per_micro_batch)
    if cost_model is not None:
        from ..cost import as_cost_model

        as_cost_model(cost_model)  # its ValueError names cost_model
    return max_token_len, cost_model, max_samples_per_micro_batch


def install(
    max_token_len: int, *, cost_model: Union[None, str, Any] = None, max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[Callable[[Any], Any]] = None, micro_batch_order: Optional[str] = None,
) -> list[tuple[str, str]]:
    """Make every transformers ``Trainer`` (TRL's ``SFTTrainer`` included) build its training
    dataloader from :class:`TokenBudgetBatchSampler` under ``max_token_len``. Call it in every
    training process before ``trainer.train()``. Idempotent; a second call changes the cap.

    With TRL 1.16's ``SFTTrainer``, pack the micro-batches padding-free with
    ``SFTConfig(padding_free=True, max_length=None)``: TRL refuses ``padding_free=True`` with a
    ``max_length`` (its default is 1024) unless it packs rows itself. A plain ``Trainer`` with a
    padding-free collator needs ``model.config.use_cache = False`` (or gradient checkpointing):
    seqbal raises a ``ValueError`` at the first training batch otherwise.

    Args:
        max_token_len: hard cap on every micro-batch's cost (a Python or NumPy integer).
        cost_model: :class:`seqbal.CostModel` or its name; default: token cost when the
            trainer's collator is padding-free (``padding_free=True``), padded cost otherwise.
        max_samples_per_micro_batch: a second hard cap, on the samples of every micro-batch;
            default None (as many as fit the tokens).
        workload_fn: what the slots balance across ranks (lengths -> non-negative workloads,
            see :func:`seqbal.plan_micro_batches`); default None: :func:`seqbal.calculate_workload`.
            Every rank must install the same model (the sampler compares it).
        micro_batch_order: the order of the micro-batches within every optimizer step (each run
            of ``gradient_accumulation_steps``): None (default) keeps the sampler's random order,
            ``"pipeline"`` runs light ones at both ends, ``"largest_first"`` the largest (tokens,
            or samples x longest under the padded cost) first, so the caching allocator reserves
            its largest blocks once. With ``gradient_accumulation_steps=1`` a step is one
            micro-batch and the order changes nothing. The same on every rank (the sampler
            compares it).

    Returns:
        the ``(owner, attribute)`` pairs that now point to seqbal.

    Raises:
        ImportError: transformers missing, or older than 5.24.0 (no ``BatchRebalanceSampler``).
        ValueError: ``max_token_len`` not a positive integer, ``max_samples_per_micro_batch``
            neither None nor a positive integer, ``cost_model`` not a cost model, ``workload_fn``
            not a workload model, ``micro_batch_order`` not None, ``"pipeline"`` or
            ``"largest_first"``; each message names the argument. Nothing is patched then.
    """
    max_token_len, cost_model, max_samples_per_micro_batch = checked_settings(
        max_token_len, cost_model, max_samples_per_micro_batch)
    plan = PlanSettings.checked(workload_fn, micro_batch_order, order_optional=True)
    try:
        module = importlib.import_module(TRAINER_MODULE)
        importlib.import_module("transformers.trainer_pt_utils").BatchRebalanceSampler
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"seqbal.integrations.trl needs transformers >= 5.24.0 (tested: {TESTED}): "
            f"{type(error).__name__}: {error}"
        ) from error
    _settings.update(max_token_len=max_token_len, cost_model=cost_model,
                     max_samples_per_micro_batch=max_samples_per_micro_batch, **plan.keywords())
    trainer = module.Trainer
    if not _patches and vars(trainer)[_NAME] is not _get_train_sampler:
        _patches.append(Patch(trainer, _NAME, _get_train_sampler))
    return apply_all(_patches)


def uninstall() -> list[tuple[str, str]]:
    """Undo :func:`install` (and remove the first-training-batch checks not yet run); does
    nothing if seqbal is not installed.

    Returns:
        the ``(owner, attribute)`` pairs that point to transformers' method again.
    """
    changed = undo_all(_patches)
    _patches.clear()
    _settings.clear()
    unwatch_all()
    return changed


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_patches)


def installed(
    max_token_len: int, *, cost_model: Union[None, str, Any] = None, max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[Callable[[Any], Any]] = None, micro_batch_order: Optional[str] = None,
) -> ContextManager[list[tuple[str, str]]]:
    """``with installed(cap): ...`` runs the block with seqbal installed (the arguments of
    :func:`install`), then uninstalls it (if it was not installed before the block)."""
    return installed_while(
        lambda: install(max_token_len, cost_model=cost_model, max_samples_per_micro_batch=max_samples_per_micro_batch,
                        workload_fn=workload_fn, micro_batch_order=micro_batch_order),
        uninstall, is_installed,
    )
