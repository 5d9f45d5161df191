"""Refuse a padding-free training batch that a transformers model would attend across.

A padding-free collator (TRL's ``DataCollatorForLanguageModeling(padding_free=True)``,
transformers' ``DataCollatorWithFlattening``) concatenates a micro-batch's sequences into one
row, gives ``position_ids`` that restart at 0 at every sequence, and no ``attention_mask``.
transformers 5.24 and 5.25 keep the sequences apart in ``masking_utils._preprocess_mask_arguments``,
which builds the packed-sequence mask only when ``position_ids is not None and attention_mask is
None and cache is None``. The cache of a decoder such as ``LlamaModel`` is ``None`` only when no
cache is passed and its effective ``use_cache`` is false: the ``use_cache`` argument when given,
else ``config.use_cache``, turned off by ``merge_with_config_defaults`` when the module
checkpoints activations (``gradient_checkpointing``) in training with gradients on. Otherwise
the mask is causal only and every sequence attends to the ones packed before it (RoPE still
restarts, so nothing looks wrong but the loss). ``Trainer.__init__`` copies
``TrainingArguments.use_cache`` (default ``False``) into ``model.config.use_cache``, and TRL's
``SFTTrainer`` also passes ``use_cache=False`` to every forward; what is left is a plain
``Trainer`` with ``use_cache=True`` (some PEFT methods want it), a config changed after the
Trainer was built, or a ``compute_loss`` that passes the cache on, and gradient checkpointing
hides each of them until it is turned off.

The check runs in a forward pre-hook on the module that builds the mask (the model's
``base_model``), on the first forward in training mode with gradients on, and evaluates that
very condition on the arguments that module receives, so it fires exactly when transformers
would skip the packed mask. Flash-attention implementations separate the sequences themselves
(from ``cu_seq_lens_*`` or ``position_ids``) and an implementation transformers has no mask
function for gets no mask at all; the check leaves both alone. The decision depends only on the
model, its config and the trainer's arguments, which are the same on every rank, so every rank
raises at the same forward, before any collective of that step's backward.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any, Optional

__all__ = ["packed_attention_problem", "watch_first_training_batch", "unwatch_all"]

_handles: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def mask_building_module(model: Any) -> Any:
    """The module whose forward builds the attention mask: ``model.base_model`` of a transformers
    model (``LlamaModel`` inside ``LlamaForCausalLM``), under a PEFT wrapper's ``get_base_model()``
    where there is one; the model itself otherwise. O(1)."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    base = getattr(inner, "base_model", None)
    return base if base is not None and hasattr(base, "forward") else inner


def packed_attention_problem(module: Any, kwargs: dict) -> Optional[str]:
    """Why transformers would let the packed sequences of this forward attend to each other, or
    None when it keeps them apart (or the batch is not padding-free). ``module`` is the
    mask-building module (:func:`mask_building_module`), ``kwargs`` the keyword arguments its
    forward receives. O(1); reads no tensor.

    The condition is transformers' own (5.24, 5.25): a padding-free batch (``position_ids`` and
    no ``attention_mask``), a mask implementation that uses the packed-sequence mask (``sdpa``,
    ``eager``, ``flex_attention``), and a cache that will exist (one passed, or an effective
    ``use_cache``).
    """
    if kwargs.get("position_ids") is None or kwargs.get("attention_mask") is not None:
        return None
    config = getattr(module, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    try:
        masking = importlib.import_module("transformers.masking_utils")
        mask_function = masking.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(implementation)
    except (ImportError, AttributeError):  # a transformers without masking_utils: not the one we know
        return None
    if mask_function is None or mask_function is getattr(masking, "flash_attention_mask", None):
        return None
    passed = kwargs.get("cache")
    if passed is None:
        passed = kwargs.get("past_key_values")  # the name before transformers renamed it
    if passed is not None:
        return f"a cache ({type(passed).__name__}) is passed to {type(module).__name__}"
    explicit = kwargs.get("use_cache")
    use_cache = explicit if explicit is not None else getattr(config, "use_cache", None)
    if not use_cache:
        return None
    import torch

    if getattr(module, "gradient_checkpointing", False) and module.training and torch.is_grad_enabled():
        return None  # transformers turns the cache off under activation checkpointing
    source = ("the forward's use_cache=True" if explicit is not None
              else "model.config.use_cache=True, which the Trainer copies from TrainingArguments.use_cache")
    return (
        f"{type(module).__name__} (attn_implementation={implementation!r}) builds a KV cache in training "
        f"({source}, gradient checkpointing off), and transformers then masks by causality alone, ignoring "
        "the sequence starts in position_ids"
    )


def _check(module: Any, args: tuple, kwargs: dict) -> None:
    import torch

    if not (module.training and torch.is_grad_enabled()):
        return  # evaluation forwards are not training; wait for the first training batch
    handle = _handles.pop(module, None)
    if handle is not None:
        handle.remove()
    problem = packed_attention_problem(module, kwargs)
    if problem is not None:
        raise ValueError(
            "seqbal: the sequences packed in this padding-free training batch would attend to each other: "
            f"{problem}. Train without the cache: TrainingArguments(use_cache=False) (the default), or "
            "model.config.use_cache = False after building the Trainer, or gradient checkpointing on."
        )


def watch_first_training_batch(model: Any) -> None:
    """Check the first training forward of ``model`` with :func:`packed_attention_problem`,
    raising a ``ValueError`` that says what to change; the hook removes itself after that
    forward. Idempotent per model. O(1)."""
    module = mask_building_module(model)
    if module in _handles:
        return
    _handles[module] = module.register_forward_pre_hook(_check, with_kwargs=True)


def unwatch_all() -> None:
    """Remove every hook :func:`watch_first_training_batch` left in place."""
    for module in list(_handles):
        handle = _handles.pop(module, None)
        if handle is not None:
            handle.remove()
