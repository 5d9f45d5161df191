"""Make axolotl's sample packing pack under a hard token cap: an axolotl plug-in, named in the
YAML config as ``plugins: [seqbal.integrations.axolotl.SeqbalPlugin]``.

axolotl 0.19.0 packs with ``MultipackBatchSampler``: first-fit over a shuffled order into bins of
``micro_batch_size x sequence_len`` tokens and at most ``sample_packing_bin_size`` samples, the
*global* list of bins dealt round-robin to the ranks by accelerate (``even_batches=False``), the
count agreed by gathering every rank's estimate and truncating to the minimum. The plug-in binds,
on the one trainer axolotl builds (``post_trainer_create``; no class or module is patched, so
there is no ``install``/``uninstall``: a config without the plug-in is axolotl's own behaviour,
and :func:`disable` unbinds it from a trainer),
a ``_get_train_sampler`` that returns :class:`AxolotlTokenBudgetBatchSampler`:
:class:`~seqbal.epochs.sampler.TokenBudgetBatchSampler` planned once over the
dataset's global lengths (every packed row within the cap and the bin size, the same count on
every rank, a multiple of ``gradient_accumulation_steps``, slot ``i`` balanced across ranks),
yielded as the same global stream axolotl's own sampler yields: slot by slot, rank 0's row,
rank 1's row, ..., so accelerate's round-robin deal hands each rank exactly its own rows. Every
rank computes the same plan from the same lengths, so no collective decides the count.

Why bind per trainer and not patch ``AxolotlTrainer``: axolotl calls plug-ins at
``post_trainer_create`` on every rank before ``trainer.train()``, and other trainer classes
(plug-ins' own, ``trainer_cls``) inherit ``_get_train_sampler`` from it or not; binding on the
instance reaches whichever class was built and nothing else.

The loss: axolotl's builder sets ``average_tokens_across_devices=False`` and, for models whose
inner ``forward`` does not name ``num_items_in_batch`` (Llama's, Qwen's, ...), turns
``model_accepts_loss_kwargs`` off, so every micro-batch's loss is its own token mean divided by
``gradient_accumulation_steps``: a token in a short row weighs more than one in a full row. With
``seqbal_token_mean_loss`` (default on) the plug-in turns both back on for this trainer: the
micro-batch's summed loss is divided by the step's label tokens over all micro-batches and
ranks, so the accumulated, rank-averaged gradient is exactly that of the step's global
token-mean loss (tested gradient-exact in float64 through axolotl's trainer).

axolotl is imported only when the plug-in's class is looked up (axolotl does that when it
reads the config); importing this module costs nothing.
"""

from __future__ import annotations

import importlib
import inspect
import types
from typing import Any, Iterator, Optional

from ..epochs.sampler import TokenBudgetBatchSampler
from ..validation import int_argument, is_int
from .trl import _FollowsTrainerEpoch, sampler_for_trainer

__all__ = ["PLUGIN", "TESTED", "micro_batch_cap", "refuse_balance_labels", "enable", "disable", "workload_fn_setting",
           "micro_batch_order_setting"]

#: How the plug-in is named in axolotl's YAML ``plugins:`` list.
PLUGIN = "seqbal.integrations.axolotl.SeqbalPlugin"
#: The axolotl stack the plug-in is tested with.
TESTED = "axolotl 0.19.0, transformers 5.16.1, accelerate 1.13.0"

_classes: dict[str, type] = {}


def micro_batch_cap(cfg: Any) -> int:
    """The token cap of every packed micro-batch: ``seqbal_max_token_len`` when set, else axolotl's
    own bin capacity ``micro_batch_size x sequence_len``. O(1).

    Raises:
        ValueError: the cap, ``micro_batch_size`` or ``sequence_len`` not a positive int.
    """
    cap = _get(cfg, "seqbal_max_token_len")
    if cap is None:
        micro, seq = _get(cfg, "micro_batch_size"), _get(cfg, "sequence_len")
        for name, value in (("micro_batch_size", micro), ("sequence_len", seq)):
            if not is_int(value) or value < 1:  # Python or NumPy ints (a config read from arrays)
                raise ValueError(f"seqbal's axolotl plug-in needs {name} to be a positive int, got {value!r}")
        cap = int(micro) * int(seq)
    return int_argument("seqbal_max_token_len", cap)


def _get(cfg: Any, name: str) -> Any:
    return cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)


class _GlobalStream(TokenBudgetBatchSampler):
    """The plan as the stream of packed rows axolotl's trainer expects from its batch sampler:
    every item is ``[row]`` (a list of one bin, the nesting axolotl's fetcher and collator read),
    slot by slot and, within a slot, rank by rank. accelerate's ``BatchSamplerShard`` keeps item
    ``j`` on rank ``j % num_replicas``, which is exactly the rank's own slot ``j // num_replicas``."""

    batch_size = 1  # one packed row per micro-batch (what accelerate's shard wrapper reads)
    drop_last = False

    def __len__(self) -> int:
        """Rows over all ranks per epoch: ``num_replicas x`` the per-rank count. O(1)."""
        return self.num_replicas * super().__len__()

    def __iter__(self) -> Iterator[list[list[int]]]:
        plan = self.epoch_plan()
        for slot in range(len(plan[0])):
            for rank_rows in plan:
                yield [rank_rows[slot]]


def _sampler_class() -> type:
    """:class:`_GlobalStream` that follows the trainer's epoch and is a torch ``BatchSampler``
    (axolotl hands a ``BatchSampler`` to the ``DataLoader`` as its batch sampler). Made once."""
    if "sampler" not in _classes:
        from torch.utils.data import BatchSampler

        _classes["sampler"] = type("AxolotlTokenBudgetBatchSampler", (_FollowsTrainerEpoch, _GlobalStream, BatchSampler), {})
    return _classes["sampler"]


def _get_train_sampler(self: Any, train_dataset: Any = None) -> Any:
    """``AxolotlTrainer._get_train_sampler`` with seqbal's token-budget sampler when sample packing
    is on; axolotl's own method otherwise."""
    original = self._seqbal_original_get_train_sampler
    args = self.args
    dataset = self.train_dataset if train_dataset is None else train_dataset
    if not getattr(args, "sample_packing", False) or getattr(args, "pretraining", False) or dataset is None \
            or not hasattr(dataset, "__len__"):
        return original(train_dataset)
    from axolotl.utils.samplers import get_dataset_lengths

    settings = self._seqbal_settings
    return sampler_for_trainer(
        _sampler_class(), self, get_dataset_lengths(dataset), settings["max_token_len"],
        max_samples_per_micro_batch=settings["max_samples_per_micro_batch"],
        shuffle=not getattr(args, "curriculum_sampling", False), workload_fn=settings.get("workload_fn"),
        micro_batch_order=settings.get("micro_batch_order"),
    )


def _forward_takes_loss_kwargs(model: Any) -> bool:
    """Whether a model's ``forward`` passes ``num_items_in_batch`` on to its loss: it names it or
    takes ``**kwargs`` (transformers' own test). O(1)."""
    base = getattr(model, "module", model)  # DDP
    base = getattr(base, "get_base_model", lambda: base)()  # PEFT
    if hasattr(base, "accepts_loss_kwargs"):
        return bool(base.accepts_loss_kwargs)
    parameters = inspect.signature(base.forward).parameters.values()
    return any(p.kind == inspect.Parameter.VAR_KEYWORD or p.name == "num_items_in_batch" for p in parameters)


def refuse_balance_labels(cfg: Any) -> None:
    """Raise where ``cfg`` asks axolotl to balance supervised tokens while the plug-in packs.

    axolotl 0.21's ``balance_labels`` balances micro-batches, accumulation windows and ranks on
    supervised tokens (``labels != -100``) in its own packing sampler; with sample packing the
    plug-in returns its own sampler instead (balanced on tokens, under the hard cap), which would
    silently drop that balancing. So the two are refused together, never combined in silence.
    Without sample packing (or when streaming a pretraining dataset) the plug-in does nothing
    and axolotl's ``balance_labels`` applies as usual. O(1).

    Raises:
        ValueError: ``balance_labels`` set with ``sample_packing`` (and no pretraining dataset).

    Examples:
        >>> refuse_balance_labels({"sample_packing": True, "balance_labels": False})
        >>> refuse_balance_labels({"sample_packing": False, "balance_labels": True})
    """
    if _get(cfg, "balance_labels") and _get(cfg, "sample_packing") and not _get(cfg, "pretraining_dataset"):
        raise ValueError(
            "balance_labels: true asks axolotl to balance supervised tokens (labels != -100) across micro-batches, "
            "accumulation windows and ranks with its own packing sampler, which seqbal's plug-in replaces with its "
            "token-budget sampler (tokens balanced under a hard cap, not supervised tokens): set balance_labels: "
            "false to pack with seqbal, or remove the plug-in to keep axolotl's label balancing"
        )


def enable(trainer: Any, cfg: Any) -> dict[str, Any]:
    """Put seqbal in charge of ``trainer``'s packed training dataloader and loss normalisation
    (what the plug-in does at ``post_trainer_create``; for code that builds the trainer itself
    with axolotl's ``HFCausalTrainerBuilder``). Does nothing when ``cfg.sample_packing`` is off or
    the run streams a pretraining dataset. O(1): the plan is made when the dataloader is.

    Settings read from ``cfg``: ``seqbal_max_token_len`` (default ``micro_batch_size x
    sequence_len``), ``sample_packing_bin_size`` (samples per packed row, axolotl's default 200),
    ``seqbal_token_mean_loss`` (default True), ``seqbal_workload_fn`` (what the slots balance
    across ranks: the import path of a callable, lengths -> non-negative workloads, as
    ``"my_package.costs:workload"`` or ``"my_package.costs.workload"``, or the callable itself;
    default :func:`seqbal.calculate_workload`), ``seqbal_micro_batch_order`` (the order of the
    packed rows within every optimizer step: ``"pipeline"`` or ``"largest_first"``, see
    :mod:`seqbal.order`; default None, the sampler's random order; the stream hands slot ``i`` to
    every rank, so every rank runs its rows in that slot order), ``max_steps`` (kept when set; otherwise the
    trainer's ``max_steps`` is reset to -1, so the step count is the sampler's exact one instead
    of axolotl's estimate from its own packing).

    Returns:
        the settings applied (empty when nothing was done).

    Raises:
        ValueError: an invalid cap; ``balance_labels`` (see :func:`refuse_balance_labels`); a
            ``seqbal_workload_fn`` that does not import or is not a workload model; a
            ``seqbal_micro_batch_order`` other than None, ``"pipeline"`` or ``"largest_first"``;
            ``multipack_real_batches`` (several rows per micro-batch is
            axolotl's own mode, not planned here); ``seqbal_token_mean_loss`` with a model whose
            ``forward`` cannot take ``num_items_in_batch`` and no ``compute_loss_func``.
    """
    if not _get(cfg, "sample_packing") or _get(cfg, "pretraining_dataset"):
        return {}
    refuse_balance_labels(cfg)
    if _get(cfg, "multipack_real_batches"):
        raise ValueError("seqbal's axolotl plug-in plans one packed row per micro-batch; multipack_real_batches=True "
                         "asks for micro_batch_size rows of sequence_len tokens: turn it off (or the plug-in)")
    bin_size = _get(cfg, "sample_packing_bin_size")
    settings = {"max_token_len": micro_batch_cap(cfg),
                "max_samples_per_micro_batch": None if bin_size is None else int(bin_size)}
    settings["workload_fn"] = workload_fn_setting(_get(cfg, "seqbal_workload_fn"))
    settings["micro_batch_order"] = micro_batch_order_setting(_get(cfg, "seqbal_micro_batch_order"))
    token_mean = _get(cfg, "seqbal_token_mean_loss")
    settings["token_mean_loss"] = True if token_mean is None else bool(token_mean)
    if settings["token_mean_loss"]:
        if trainer.compute_loss_func is None and not _forward_takes_loss_kwargs(trainer.model):
            raise ValueError(
                f"seqbal_token_mean_loss needs the model's forward to take num_items_in_batch (or **kwargs) for its "
                f"loss; {type(trainer.model).__name__}.forward does not. Set seqbal_token_mean_loss: false to keep "
                "axolotl's per-micro-batch normalisation"
            )
        trainer.model_accepts_loss_kwargs = trainer.compute_loss_func is None or trainer.model_accepts_loss_kwargs
        trainer.args.average_tokens_across_devices = True
    if _get(cfg, "max_steps") is None:
        trainer.args.max_steps = -1
    if "_seqbal_original_get_train_sampler" not in vars(trainer):
        trainer._seqbal_original_get_train_sampler = trainer._get_train_sampler
    trainer._seqbal_settings = settings
    trainer._get_train_sampler = types.MethodType(_get_train_sampler, trainer)
    return settings


def workload_fn_setting(value: Any) -> Any:
    """``seqbal_workload_fn`` as a workload model: None stays None (the default model), a
    callable is taken as it is, a string ``"module:name"`` or ``"module.name"`` is imported.

    Raises:
        ValueError: a path that does not import, or that names no workload model (checked on the
            probe lengths, :func:`seqbal.workload.workload_digest`).

    >>> workload_fn_setting("seqbal.workload:calculate_workload").__name__
    'calculate_workload'
    """
    from ._settings import PlanSettings

    if isinstance(value, str):
        module_name, _, name = value.partition(":") if ":" in value else value.rpartition(".")
        try:
            value = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError, ValueError) as error:
            raise ValueError(
                f"seqbal_workload_fn={value!r} does not import ({type(error).__name__}: {error}): give "
                f"'package.module:name' of a callable lengths -> workloads"
            ) from None
    try:
        return PlanSettings.checked(value, "pipeline").workload_fn
    except ValueError as error:
        raise ValueError(f"seqbal_workload_fn: {error}") from None


def micro_batch_order_setting(value: Any) -> Optional[str]:
    """``seqbal_micro_batch_order`` checked: None (the sampler's random order), ``"pipeline"`` or
    ``"largest_first"``. O(1).

    Raises:
        ValueError: any other value, named in the message.

    >>> micro_batch_order_setting("largest_first")
    'largest_first'
    """
    from ..order import check_micro_batch_order

    if value is None:
        return None
    try:
        return check_micro_batch_order(value)
    except ValueError as error:
        raise ValueError(f"seqbal_{error}") from None


def disable(trainer: Any) -> bool:
    """Give ``trainer`` its own ``_get_train_sampler`` back (the loss settings stay as they are).
    Returns whether seqbal was bound. O(1)."""
    if "_seqbal_original_get_train_sampler" not in vars(trainer):
        return False
    del trainer._get_train_sampler, trainer._seqbal_original_get_train_sampler, trainer._seqbal_settings
    return True


def _input_args_class() -> type:
    """The plug-in's config keys, a pydantic model axolotl merges into its config schema."""
    if "args" not in _classes:
        from pydantic import BaseModel, Field, model_validator

        class SeqbalArgs(BaseModel):
            """seqbal's settings in axolotl's YAML config (merged into axolotl's config schema, so
            its check runs when axolotl validates the config, before any model is loaded)."""

            seqbal_max_token_len: Optional[int] = Field(
                default=None, description="Hard cap on the tokens of every packed micro-batch (one row); default "
                "micro_batch_size x sequence_len.")
            seqbal_workload_fn: Optional[str] = Field(
                default=None, description="What the micro-batches balance across ranks: the import path "
                "'package.module:name' of a callable, lengths -> non-negative workloads; default seqbal's "
                "FLOPs formula 24576 s + s^2.")
            seqbal_micro_batch_order: Optional[str] = Field(
                default=None, description="The order of the packed rows within every optimizer step: 'pipeline' "
                "(light ones at both ends) or 'largest_first' (the caching allocator reserves its largest blocks "
                "once); default the sampler's random order.")
            seqbal_token_mean_loss: Optional[bool] = Field(
                default=None, description="Normalise the loss by the step's label tokens over all micro-batches and "
                "ranks (the step's global token mean); default true.")

            @model_validator(mode="after")
            def _no_label_balancing_under_seqbal(self):  # noqa: ANN202 - pydantic's hook
                refuse_balance_labels({name: getattr(self, name, None)
                                       for name in ("balance_labels", "sample_packing", "pretraining_dataset")})
                micro_batch_order_setting(self.seqbal_micro_batch_order)
                return self

        SeqbalArgs.__module__ = __name__
        _classes["args"] = SeqbalArgs
    return _classes["args"]


def _plugin_class() -> type:
    """The ``BasePlugin`` subclass axolotl loads from ``plugins:``. Made once, on first lookup."""
    if "plugin" not in _classes:
        base = importlib.import_module("axolotl.integrations.base").BasePlugin

        class SeqbalPlugin(base):
            """Pack axolotl's training micro-batches with seqbal's token-budget sampler (see
            :mod:`seqbal.integrations.axolotl`)."""

            def get_input_args(self) -> str:
                return f"{__name__}.SeqbalArgs"

            def post_trainer_create(self, cfg: Any, trainer: Any) -> None:
                enable(trainer, cfg)

        SeqbalPlugin.__module__ = __name__
        _classes["plugin"] = SeqbalPlugin
    return _classes["plugin"]


def __getattr__(name: str) -> Any:
    if name == "SeqbalPlugin":
        return _plugin_class()
    if name == "SeqbalArgs":
        return _input_args_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

