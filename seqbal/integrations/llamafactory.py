"""Give both LLaMA-Factory 0.9.5 trainers a hard cap: one call, :func:`install`, and
:func:`uninstall`. The classic ``CustomSeq2SeqTrainer`` (``llamafactory-cli train``, ``stage:
sft``) trains from a token-budget batch sampler (:mod:`seqbal.integrations._llamafactory_classic`
says how); the new trainer runs exactly ``num_micro_batch`` capped, balanced micro-batches per
step, as follows.

LLaMA-Factory 0.9.5's new trainer (``llamafactory.v1``) takes every step from its
``BatchGenerator``, whose batching strategy is a named plug-in (``BatchingPlugin``). Its
``dynamic_batching`` strategy fills each rank's own stream in arrival order up to
``cutoff_len x micro_batch_size`` padded tokens per micro-batch and emits ``num_micro_batch``
of them per step, with no balance across ranks, truncating every sample to ``cutoff_len``;
``dynamic_padding_free`` does the same by tokens and packs each micro-batch into one row.

:func:`install` registers seqbal's ``fill_buffer`` and ``generate_batch`` for both strategy
names (the configuration keeps ``batching_strategy: dynamic_batching`` or
``dynamic_padding_free``), built on :class:`seqbal.StepPlanner`'s fixed-count mode:

* every step has exactly ``num_micro_batch`` micro-batches on every data-parallel rank, each
  within ``max_token_len`` (padded cost for ``dynamic_batching``, whose micro-batches are padded
  to their longest sample; token cost for ``dynamic_padding_free``), filled with as many
  pending samples as fit (the oldest one always, the oldest first where that costs under 1% of
  the tokens), and balanced slot by slot across the ranks;
* no sample is truncated: a sample over the cap is a ``ValueError`` on every rank, naming the
  rank, the sample's place in that rank's stream, its tokens and the cap;
* the ranks share one pool: before each step every rank reads its share of new samples from
  its own data provider, and one ``all_gather_object`` over the data-parallel group gives every
  rank every new sample (and every rank's settings and errors, so every rank raises alike and
  none is left waiting). Every rank then plans the same step from the same pool with no further
  collective and keeps its own micro-batches. The pool lives in LLaMA-Factory's own
  ``StatefulBuffer``, so its checkpoints carry it.

The price of the shared pool: each step moves every new sample's token lists to every rank
(pickled Python lists, as ``all_gather_object`` sends them), about ``ranks x`` the tokens the
step trains; the pool holds about 1.25 steps of tokens, so a sample waits about a step at most.

LLaMA-Factory is imported only when :func:`install` runs. Tested with :data:`TESTED`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, ContextManager, Optional, Union

import numpy as np

from ._patching import Patch, apply_all, installed_while, undo_all
from ._settings import PlanSettings
from ..workload import workload_digest

__all__ = ["install", "uninstall", "is_installed", "installed", "TESTED", "STRATEGIES"]

#: The LLaMA-Factory stack this adapter is tested with.
TESTED = "llamafactory 0.9.5 with transformers 5.6.0 and accelerate 1.11.0"
#: The batching strategies :func:`install` replaces, and the cost each one's micro-batches have.
STRATEGIES = {"dynamic_batching": "padded", "dynamic_padding_free": "tokens"}
#: The pool each step plans from holds about this many times the step's token capacity.
POOL_HEADROOM = 1.25
#: The module that holds LLaMA-Factory's ``BatchingPlugin`` and its strategies.
BATCHING_MODULE = "llamafactory.v1.plugins.trainer_plugins.batching"

_settings: dict[str, Any] = {}
_replaced: list[Patch] = []


# -- what every step needs --------------------------------------------------------------------

def _data_parallel() -> tuple[Any, int, int]:
    """(group, rank, ranks) of LLaMA-Factory's data-parallel dimension; (None, 0, 1) when it
    does not run distributed."""
    interface = importlib.import_module("llamafactory.v1.accelerator.interface")
    dist = interface.DistributedInterface()
    ranks = dist.get_world_size(interface.Dim.DP)
    if ranks <= 1:
        return None, 0, 1
    return dist.get_group(interface.Dim.DP), dist.get_rank(interface.Dim.DP), ranks


def _step_settings(batch_info: dict, strategy: str) -> tuple[int, Any, Optional[int]]:
    """(cap, cost model, sample cap) of a step: the installed cap, else LLaMA-Factory's own budget
    ``cutoff_len x micro_batch_size``."""
    from ..cost import as_cost_model

    cap = _settings.get("max_token_len") or int(batch_info["cutoff_len"]) * int(batch_info["micro_batch_size"])
    cost_model = as_cost_model(_settings.get("cost_model") or STRATEGIES[strategy])
    return cap, cost_model, _settings.get("max_samples_per_micro_batch")


def _length(sample: dict) -> int:
    return len(sample["input_ids"])


def _fill_buffer(strategy: str, buffer: Any, batch_info: dict, next_samples: Callable[[bool], Optional[list]]) -> None:
    """Read this rank's share of new samples and share them with every rank (one collective).

    The pool (``buffer``) is the same on every rank before and after. This rank reads until its
    new samples bring the pool to ``num_micro_batch x ranks`` samples and :data:`POOL_HEADROOM`
    times the step's token capacity, split evenly over the ranks; like LLaMA-Factory's own
    dynamic strategies it restarts its data provider when it runs out (the run is step-driven).
    Every check (a sample over the cap, ranks with other settings or pools) is gathered with
    the samples and raised on every rank alike.
    """
    cap, cost_model, _ = _step_settings(batch_info, strategy)
    group, rank, ranks = _data_parallel()
    per_step = int(batch_info["num_micro_batch"]) * ranks
    pending = buffer.samples
    missing_samples = max(0, per_step - len(pending))
    missing_cost = max(0.0, POOL_HEADROOM * per_step * cost_model.token_capacity(cap)
                       - int(cost_model.sample_costs(np.array([_length(s) for s in pending], dtype=np.int64)).sum()))
    my_samples, my_cost = -(-missing_samples // ranks), missing_cost / ranks
    new: list = []
    added, error = 0, None
    while error is None and (len(new) < my_samples or added < my_cost):
        read = next_samples(True)
        if not read:
            break
        for sample in read:
            cost = cost_model.cost([_length(sample)])
            if cost > cap:
                error = (len(new), _length(sample), cost)
                break
            new.append(sample)
            added += int(cost_model.sample_costs(np.array([_length(sample)]))[0])
    plan = _settings.get("plan", PlanSettings())
    facts = (cap, repr(cost_model), int(batch_info["num_micro_batch"]), ranks, len(pending),
             (workload_digest(plan.workload_fn), plan.micro_batch_order))
    if group is None:
        everyone = [(facts, error, new)]
    else:
        from ..collectives import gather_objects

        # Every rank's samples, settings and error in one collective: every check below sees the
        # same data on every rank, so all raise together or none does.
        everyone = gather_objects((facts, error, new), group)
    from ..collectives import first_disagreement

    names = ("max_token_len", "cost model", "num_micro_batch", "data-parallel ranks", "samples pending",
             "(workload_fn digest on probe lengths, micro_batch_order)")
    differ = first_disagreement([other for other, _, _ in everyone], names)
    if differ is not None:
        name, mine, other_rank, theirs = differ
        raise ValueError(f"seqbal: the data-parallel ranks disagree: rank 0 has {name}={mine!r}, "
                         f"rank {other_rank} has {theirs!r}; every rank must install seqbal alike")
    for other_rank, (_, other_error, _) in enumerate(everyone):
        if other_error is not None:
            position, length, cost = other_error
            kind = "" if cost_model.is_default else f" ({cost_model} cost {cost})"
            raise ValueError(
                f"seqbal: sample {position} of the new samples rank {other_rank} read has {length} tokens{kind}, "
                f"which exceeds max_token_len {cap} ({strategy}: every sample must fit a micro-batch alone; "
                f"seqbal never truncates one): raise max_token_len or drop samples longer than the cap"
            )
    for _, _, samples in everyone:
        if samples:
            buffer.put(samples)


def _collate(strategy: str, samples: list) -> dict:
    """One micro-batch in LLaMA-Factory's own format, never truncated: padded to its longest
    sample (``dynamic_batching``), or packed into one row (``dynamic_padding_free``)."""
    module = importlib.import_module(BATCHING_MODULE)
    longest = max(_length(s) for s in samples)
    if strategy == "dynamic_padding_free":
        return module._pack_padding_free_samples(samples, longest)
    return module.default_collate(module.pad_and_truncate(samples, longest))


def _generate_batch(strategy: str, buffer: Any, batch_info: dict) -> Optional[list[dict]]:
    """This rank's ``num_micro_batch`` micro-batches of the next step, or None (LLaMA-Factory
    then ends the pass) when the pool cannot fill a step. No collective: every rank plans the
    same step from the same pool. O(pool) plus the step planner's work."""
    from ..stream import StepPlanner

    cap, cost_model, sample_cap = _step_settings(batch_info, strategy)
    _, rank, ranks = _data_parallel()
    samples = buffer.samples
    if not samples:
        return None
    planner = StepPlanner(cap, ranks, micro_batches_per_step=int(batch_info["num_micro_batch"]),
                          cost_model=cost_model, max_samples_per_micro_batch=sample_cap,
                          oldest_first=True,  # a new planner every step: the buffer drains in order, none left behind
                          **_settings.get("plan", PlanSettings()).keywords())
    planner.add(range(len(samples)), [_length(s) for s in samples])  # oldest first: buffer order
    step = planner.next_step()
    if step is None:
        return None
    taken = {i for micro_batches in step for micro_batch in micro_batches for i in micro_batch}
    left = [s for i, s in enumerate(samples) if i not in taken]
    buffer.load_state_dict({"buffer": left, "buffer_size": sum(_length(s) for s in left)})
    return [_collate(strategy, [samples[i] for i in micro_batch]) for micro_batch in step[rank]]


def _strategy_functions(strategy: str) -> dict[str, Callable]:
    def fill_buffer(buffer: Any, batch_info: dict, next_samples: Callable[[bool], Optional[list]]) -> None:
        return _fill_buffer(strategy, buffer, batch_info, next_samples)

    def generate_batch(buffer: Any, batch_info: dict) -> Optional[list[dict]]:
        return _generate_batch(strategy, buffer, batch_info)

    fill_buffer.__qualname__ = f"seqbal_{strategy}_fill_buffer"
    generate_batch.__qualname__ = f"seqbal_{strategy}_generate_batch"
    return {"fill_buffer": fill_buffer, "generate_batch": generate_batch}


# -- installing -------------------------------------------------------------------------------

def _install_new_trainer() -> list[tuple[str, str]]:
    """Register seqbal's ``fill_buffer`` and ``generate_batch`` for :data:`STRATEGIES`."""
    try:
        module = importlib.import_module(BATCHING_MODULE)
    except ImportError as error:
        raise ImportError(f"seqbal.integrations.llamafactory needs LLaMA-Factory's new trainer "
                          f"(tested: {TESTED}): {type(error).__name__}: {error}") from error
    if not _replaced:
        registry = module.BatchingPlugin._registry
        for strategy in STRATEGIES:
            for method, function in _strategy_functions(strategy).items():
                _replaced.append(Patch(registry[strategy], method, function, label=f"BatchingPlugin({strategy!r})"))
    return apply_all(_replaced)


def install(
    max_token_len: Optional[int] = None, *, cost_model: Union[None, str, Any] = None,
    max_samples_per_micro_batch: Optional[int] = None, workload_fn: Optional[Callable[[Any], Any]] = None,
    micro_batch_order: Optional[str] = None,
) -> list[tuple[str, str]]:
    """Give both LLaMA-Factory trainers seqbal's cap: the new trainer's ``dynamic_batching`` and
    ``dynamic_padding_free`` steps come from :class:`seqbal.StepPlanner`, and the classic
    ``CustomSeq2SeqTrainer`` builds its training dataloader from a token-budget batch sampler
    (:mod:`seqbal.integrations._llamafactory_classic`). Call it in every training process
    before the trainer is built (a launcher script that then calls ``run_sft()`` or
    ``run_exp()``). Idempotent; a second call changes the settings.

    Args:
        max_token_len: hard cap on every micro-batch's cost. Default None: LLaMA-Factory's own
            budget, ``cutoff_len x micro_batch_size`` for the new trainer; for the classic
            trainer the cost of the largest micro-batch it could build itself,
            ``per_device_train_batch_size`` rows as long as the longest, padded as its collator pads.
        cost_model: :class:`seqbal.CostModel` or its name; default: padded cost for
            ``dynamic_batching`` and the classic trainer (rounded up to its collator's multiple
            of 8), token cost for ``dynamic_padding_free``.
        max_samples_per_micro_batch: a second hard cap, on the samples of every micro-batch;
            default None.
        workload_fn: what both trainers balance across ranks (lengths -> non-negative
            workloads, see :func:`seqbal.plan_micro_batches`); default None:
            :func:`seqbal.calculate_workload`. Every rank must install the same model (the
            ranks compare it with their other settings).
        micro_batch_order: the order of both trainers' micro-batches in a step:
            ``"pipeline"`` or ``"largest_first"`` (:mod:`seqbal.order`). Default None: the new
            trainer's ``"pipeline"``, and the classic trainer's sampler keeps its random slot
            order (a fresh mix every epoch).

    Returns:
        the ``(owner, method)`` pairs that now point to seqbal: ``BatchingPlugin(strategy)``
        methods and transformers' ``Trainer.get_train_dataloader``.

    Raises:
        ImportError: LLaMA-Factory missing (tested: :data:`TESTED`); nothing is installed.
        ValueError: an argument that is not what it must be, naming it; nothing is installed.
    """
    from . import _llamafactory_classic as classic
    from .trl import checked_settings

    cap, cost_model, sample_cap = checked_settings(max_token_len, cost_model, max_samples_per_micro_batch,
                                                   cap_optional=True)
    plan = PlanSettings.checked(workload_fn, micro_batch_order, order_optional=True)
    was_classic = classic.is_installed()
    changed = classic.install(cap, cost_model=cost_model, max_samples_per_micro_batch=sample_cap,
                              **plan.keywords())
    plan = PlanSettings(plan.workload_fn, plan.micro_batch_order or "pipeline")  # the new trainer's default
    try:
        changed += _install_new_trainer()
    except ImportError:
        if not was_classic:
            classic.uninstall()
        raise
    _settings.update(max_token_len=cap, cost_model=cost_model, max_samples_per_micro_batch=sample_cap, plan=plan)
    return changed


def uninstall() -> list[tuple[str, str]]:
    """Undo :func:`install` for both trainers; does nothing if seqbal is not installed.

    Returns:
        the ``(owner, method)`` pairs that point to LLaMA-Factory's and transformers' own again.
    """
    from . import _llamafactory_classic as classic

    changed = undo_all(_replaced)
    _replaced.clear()
    _settings.clear()
    return changed + classic.uninstall()


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    from . import _llamafactory_classic as classic

    return bool(_replaced) or classic.is_installed()


def installed(
    max_token_len: Optional[int] = None, *, cost_model: Union[None, str, Any] = None,
    max_samples_per_micro_batch: Optional[int] = None, workload_fn: Optional[Callable[[Any], Any]] = None,
    micro_batch_order: Optional[str] = None,
) -> ContextManager[list[tuple[str, str]]]:
    """``with installed(): ...`` runs the block with seqbal installed (the arguments of
    :func:`install`), then uninstalls it (if it was not installed before the block)."""
    return installed_while(
        lambda: install(max_token_len, cost_model=cost_model, max_samples_per_micro_batch=max_samples_per_micro_batch,
                        workload_fn=workload_fn, micro_batch_order=micro_batch_order),
        uninstall, is_installed,
    )
