"""Make LLaMA-Factory's classic SFT trainer (``CustomSeq2SeqTrainer``, the one
``llamafactory-cli train`` runs for ``stage: sft``) train under a token budget: :func:`install`,
:func:`uninstall`.

Why the training dataloader is replaced, not the sampler: LLaMA-Factory 0.9.5 pins transformers
<= 5.6.0, whose ``Trainer._get_dataloader`` hands whatever ``_get_train_sampler`` returns to the
``DataLoader`` as a per-sample ``sampler`` with ``per_device_train_batch_size``; it has no way to
take a *batch* sampler (transformers 5.24's ``BatchRebalanceSampler`` route, which
:mod:`seqbal.integrations.trl` rides, does not exist there). So :func:`install` rebinds
transformers' ``Trainer.get_train_dataloader`` to one that, for a ``CustomSeq2SeqTrainer`` only
(every other trainer gets transformers' method unchanged), builds the same ``DataLoader``
transformers would (its column removal, collator, workers, pinning, worker seeding) but with a
:class:`~seqbal.epochs.sampler.TokenBudgetBatchSampler` as its ``batch_sampler``:
every micro-batch within ``max_token_len``, the same count on every rank (a multiple of
``gradient_accumulation_steps``), slot-balanced across ranks, every sample once per epoch, the
ranks' lengths and settings checked against each other in one all-reduce when it is built.

accelerate (1.11) then wraps that batch sampler in a ``BatchSamplerShard`` that would hand rank
``r`` every ``world``-th micro-batch of *its own* plan: seqbal's sampler is already rank-aware,
so the wrapper is made a pass-through (one process, index 0), as transformers 5.24 does for its
rebalancing sampler. The sampler follows the trainer's epoch (``floor(trainer.state.epoch)``)
when an epoch starts, so a run resumed mid-epoch, where transformers calls accelerate's
``skip_first_batches``, skips exactly the batches of that epoch already trained.

Lengths: ``len(input_ids)`` of LLaMA-Factory's tokenized rows (a ``length`` column where the
dataset has one). With ``packing`` (and ``neat_packing``) LLaMA-Factory packs samples into rows
padded to ``cutoff_len`` before training; a row counts as one sample, so a micro-batch holds
``max_token_len // cutoff_len`` rows (rounded to 8). Default cost: padded, each length rounded up
to the collator's ``pad_to_multiple_of`` (LLaMA-Factory pads every training batch to its longest
row, rounded up to 8), so the cap bounds the tensor the model actually receives. LLaMA-Factory
truncates every SFT sample to ``cutoff_len`` when it tokenizes (silently); a sample it keeps that
is still over the cap is an error here, never cut.

Only ``CustomSeq2SeqTrainer`` (``stage: sft``) is changed; LLaMA-Factory's other classic trainers
(``pt``, ``rm``, ``dpo``, ``kto``, ``ppo``) keep their own samplers. llamafactory and transformers
are imported only when :func:`install` runs.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Optional, Union

from ._patching import Patch, apply_all, undo_all
from ._settings import PlanSettings
from ..epochs.sampler import TokenBudgetBatchSampler
from .trl import _FollowsTrainerEpoch, checked_settings, dataset_lengths, sampler_for_trainer

__all__ = ["install", "uninstall", "is_installed", "LlamaFactoryTokenBudgetBatchSampler", "TESTED"]

#: The module of the trainer seqbal changes, and the transformers method it replaces.
TRAINER_MODULE = "llamafactory.train.sft.trainer"
_NAME = "get_train_dataloader"
#: The stack the adapter is tested with.
TESTED = "llamafactory 0.9.5 with transformers 5.6.0 and accelerate 1.11.0"

_patches: list[Patch] = []
_settings: dict[str, Any] = {}
_classes: dict[str, type] = {}
_warned: list[bool] = []


class LlamaFactoryTokenBudgetBatchSampler(_FollowsTrainerEpoch, TokenBudgetBatchSampler):
    """:class:`~seqbal.epochs.sampler.TokenBudgetBatchSampler` that reads the
    trainer's epoch when the dataloader starts one (accelerate's wrappers do not forward
    ``set_epoch``), so fresh and resumed epochs give the same batches on every rank."""


def _default_cost(collator: Any) -> Any:
    """Padded cost, each length rounded up to the collator's ``pad_to_multiple_of``. O(1)."""
    from ..cost import CostModel

    multiple = getattr(collator, "pad_to_multiple_of", None) or 1
    return CostModel(padded=True, round_to=int(multiple))


def _check_trainer(trainer: Any, collator: Any) -> None:
    """What seqbal cannot serve, as a ``ValueError`` naming the setting. Every rank runs the same
    configuration, so every rank raises here, before any collective. O(1)."""
    accelerator = trainer.accelerator
    for name in ("dispatch_batches", "split_batches"):
        if getattr(accelerator, name, False):
            raise ValueError(
                f"seqbal's token budget plans every rank's micro-batches itself; accelerate's {name}=True would "
                f"split or dispatch them again: turn {name} off (accelerator_config) or uninstall seqbal"
            )
    mesh = getattr(getattr(accelerator, "state", None), "ds_device_mesh", None) or getattr(
        accelerator, "torch_device_mesh", None)
    names = getattr(mesh, "mesh_dim_names", None) or ()
    shared = {name: mesh[name].size() for name in ("tp", "cp") if name in names and mesh[name].size() > 1}
    if shared:
        raise ValueError(
            f"seqbal plans one data-parallel rank per process; this run's device mesh shares inputs across ranks "
            f"({', '.join(f'{k}={v}' for k, v in shared.items())}): tensor and context parallelism are not supported"
        )
    if (getattr(collator, "neat_packing", False) and getattr(collator, "attn_implementation", None) == "flash_attention_2"
            and _settings.get("max_samples_per_micro_batch") != 1):
        raise ValueError(
            "LLaMA-Factory's neat_packing with flash_attention_2 takes one packed row per micro-batch; install seqbal "
            f"with max_samples_per_micro_batch=1 (got {_settings.get('max_samples_per_micro_batch')}), or use "
            "another attention implementation"
        )


def _length_advice(cost: Any, cap: int) -> str:
    """What to change in LLaMA-Factory's arguments when a row is over the cap. O(1)."""
    step = getattr(cost, "round_to", 1) or 1
    most = cap - cap % step
    return (f" LLaMA-Factory truncates SFT samples to cutoff_len (silently): set cutoff_len <= {most} "
            f"(max_token_len rounded down to the collator's multiple of {step}) to have it truncate them, drop "
            "them from the data, or raise max_token_len.")


def _own_largest_micro_batch(args: Any, lengths: list[int], cost_model: Any) -> int:
    """The default cap: the cost of the largest micro-batch LLaMA-Factory itself could build,
    ``per_device_train_batch_size`` copies of the longest row (under ``cost_model``: padded and
    rounded up to the collator's multiple by default). O(n)."""
    from ..cost import as_cost_model

    longest = max(lengths) if lengths else 1
    return as_cost_model(cost_model).cost([longest] * max(1, int(args.per_device_train_batch_size)))


def _sampler(trainer: Any, dataset: Any, collator: Any) -> LlamaFactoryTokenBudgetBatchSampler:
    """The token-budget batch sampler for ``trainer``'s training ``dataset``. Builds on every rank
    (one all-reduce where torch.distributed is initialised and there is more than one rank)."""
    args = trainer.args
    cost_model = _settings.get("cost_model")
    cost_model = _default_cost(collator) if cost_model is None else cost_model
    lengths = dataset_lengths(dataset, getattr(args, "length_column_name", "length"))
    cap = _settings["max_token_len"] or _own_largest_micro_batch(args, lengths, cost_model)
    if not _warned:
        _warned.append(True)
        warnings.warn(
            f"seqbal: per_device_train_batch_size={args.per_device_train_batch_size} no longer limits a micro-batch; "
            f"each holds at most max_token_len={cap} tokens under the {cost_model} and as many samples as fit. It "
            "only enters transformers' logged total_train_batch_size.", stacklevel=3,
        )
    finetuning = getattr(trainer, "finetuning_args", None)

    def advice() -> str:
        from ..cost import as_cost_model

        return _length_advice(as_cost_model(cost_model), cap)

    return sampler_for_trainer(
        LlamaFactoryTokenBudgetBatchSampler, trainer, lengths, cap, cost_model=cost_model,
        max_samples_per_micro_batch=_settings.get("max_samples_per_micro_batch"),
        shuffle=not getattr(finetuning, "disable_shuffling", False), advice=advice,
        workload_fn=_settings.get("workload_fn"), micro_batch_order=_settings.get("micro_batch_order"),
    )


def _get_train_dataloader(self: Any) -> Any:
    """``Trainer.get_train_dataloader``: for a ``CustomSeq2SeqTrainer`` with a sized map-style
    dataset, transformers' training ``DataLoader`` with seqbal's batch sampler; otherwise
    transformers' own."""
    import torch

    original = _patches[0].original if _patches else None
    trainer_class = _classes.get("trainer")
    dataset = self.train_dataset
    if (trainer_class is None or not isinstance(self, trainer_class) or dataset is None
            or isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__")):
        return original(self)
    from functools import partial

    from transformers.trainer_utils import seed_worker

    collator = self.data_collator
    try:
        import datasets

        is_hf_dataset = isinstance(dataset, datasets.Dataset)
    except ImportError:  # pragma: no cover - LLaMA-Factory depends on datasets
        is_hf_dataset = False
    if is_hf_dataset:
        dataset = self._remove_unused_columns(dataset, description="Training")
    else:
        collator = self._get_collator_with_removed_columns(collator, description="Training")
    _check_trainer(self, collator)
    sampler = _sampler(self, dataset, collator)
    args = self.args
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collator, num_workers=args.dataloader_num_workers,
        pin_memory=args.dataloader_pin_memory, persistent_workers=args.dataloader_persistent_workers,
        prefetch_factor=args.dataloader_prefetch_factor,
        worker_init_fn=partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index),
    )
    accelerator = self.accelerator
    # accelerate refuses to shard a batch sampler without a batch size under even_batches; the
    # shard is made a pass-through below, and seqbal's counts are even by construction
    even = accelerator.even_batches
    accelerator.even_batches = False
    try:
        prepared = accelerator.prepare(loader)
    finally:
        accelerator.even_batches = even
    shard = getattr(prepared, "batch_sampler", None)
    if shard is not sampler and getattr(shard, "batch_sampler", None) is sampler:
        # accelerate's BatchSamplerShard: seqbal's sampler already yields this rank's share
        shard.num_processes, shard.process_index = 1, 0
    return prepared


def install(
    max_token_len: Optional[int] = None, *, cost_model: Union[None, str, Any] = None, max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[Any] = None, micro_batch_order: Optional[str] = None,
) -> list[tuple[str, str]]:
    """Make LLaMA-Factory's SFT trainer (``CustomSeq2SeqTrainer``) build its training dataloader
    from a token-budget batch sampler under ``max_token_len``. Call it in every training process
    before training starts (before ``llamafactory.train.tuner.run_exp``). Idempotent; a second
    call changes the settings.

    What changes for the run: a micro-batch holds as many samples as fit ``max_token_len`` (under
    the cost model) instead of ``per_device_train_batch_size``; every rank runs the same number
    of micro-batches per epoch (a multiple of ``gradient_accumulation_steps``), similar work slot
    by slot; every sample is trained once per epoch (over all ranks), a fresh mix every epoch
    unless ``disable_shuffling``; a sample over the cap is a ``ValueError`` naming it on every
    rank when the dataloader is built (LLaMA-Factory itself truncates to ``cutoff_len``).

    Args:
        max_token_len: hard cap on every micro-batch's cost (a Python or NumPy integer);
            default None: the cost of the largest micro-batch LLaMA-Factory itself could build,
            ``per_device_train_batch_size`` rows as long as the longest row, padded as its
            collator pads (so never more memory than LLaMA-Factory's own worst step).
        cost_model: :class:`seqbal.CostModel` or its name; default the padded cost with lengths
            rounded up to the collator's ``pad_to_multiple_of`` (8 when training), what
            LLaMA-Factory's collator builds.
        max_samples_per_micro_batch: a second hard cap, on the samples (rows) of every
            micro-batch; default None (as many as fit). Give 1 with ``neat_packing`` and
            ``flash_attention_2``.
        workload_fn: what the slots balance across ranks (lengths -> non-negative workloads);
            default None: :func:`seqbal.calculate_workload`. The same model on every rank.
        micro_batch_order: the order of the micro-batches within every optimizer step (each run
            of ``gradient_accumulation_steps``): None (default) keeps the sampler's random order,
            ``"pipeline"`` or ``"largest_first"`` (largest padded batch first) as in
            :mod:`seqbal.order`. The same on every rank (the sampler compares it).

    Returns:
        the ``(owner, attribute)`` pairs that now point to seqbal.

    Raises:
        ImportError: llamafactory (or its transformers) missing, or a version whose SFT trainer
            does not build its dataloader through ``Trainer.get_train_dataloader``.
        ValueError: ``max_token_len`` not a positive integer, ``max_samples_per_micro_batch``
            neither None nor a positive integer, ``cost_model`` not a cost model, ``workload_fn``
            not a workload model, ``micro_batch_order`` unknown; each message names the
            argument. Nothing is patched then.

    Examples:
        >>> from seqbal.integrations import llamafactory  # doctest: +SKIP
        >>> llamafactory.install(4096)  # doctest: +SKIP
        [('Trainer', 'get_train_dataloader')]
    """
    max_token_len, cost_model, max_samples_per_micro_batch = checked_settings(
        max_token_len, cost_model, max_samples_per_micro_batch, cap_optional=True)
    plan = PlanSettings.checked(workload_fn, micro_batch_order, order_optional=True)
    try:
        trainer_class = importlib.import_module(TRAINER_MODULE).CustomSeq2SeqTrainer
        base = importlib.import_module("transformers.trainer").Trainer
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"seqbal.integrations.llamafactory needs llamafactory's CustomSeq2SeqTrainer (tested: {TESTED}): "
            f"{type(error).__name__}: {error}"
        ) from error
    owner = next((klass for klass in trainer_class.__mro__ if _NAME in vars(klass)), None)
    if owner is not base:
        raise ImportError(
            f"seqbal.integrations.llamafactory: {trainer_class.__qualname__}.{_NAME} comes from "
            f"{getattr(owner, '__qualname__', owner)}, not transformers' Trainer (tested: {TESTED})"
        )
    _settings.update(max_token_len=max_token_len, cost_model=cost_model,
                     max_samples_per_micro_batch=max_samples_per_micro_batch, **plan.keywords())
    _classes["trainer"] = trainer_class
    if not _patches and vars(base)[_NAME] is not _get_train_dataloader:
        _patches.append(Patch(base, _NAME, _get_train_dataloader))
    return apply_all(_patches)


def uninstall() -> list[tuple[str, str]]:
    """Undo :func:`install`: transformers' ``Trainer.get_train_dataloader`` again (only where
    seqbal's is still bound), so LLaMA-Factory's own sampler; does nothing if seqbal is not
    installed.

    Returns:
        the ``(owner, attribute)`` pairs that point to transformers' method again.
    """
    changed = undo_all(_patches)
    _patches.clear()
    _settings.clear()
    _classes.clear()
    return changed


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_patches)
