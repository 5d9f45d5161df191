"""Make a running OpenRLHF micro-batch with seqbal: one call, :func:`install`, and :func:`uninstall`.

OpenRLHF 0.11.2 (``--train.dynamic_batch_enable``) plans micro-batches in two places, and neither
holds its token cap:

- the training step, ``NaiveReplayBuffer.setup_dynamic_batch`` (each actor and critic rank):
  a first-fit count, a MAX all-reduce over the data-parallel group, then Karmarkar-Karp on
  tokens at that count with no check of the cap, so a micro-batch can exceed
  ``train.max_tokens_per_gpu x ring_attn_size x tensor_parallel_size``;
- the rollout split, ``RemoteExperienceMaker.split_rollout_samples`` (the driver): the
  first-fit count rounded *down* to a multiple of the effective actor count, so five samples
  of 3,000 tokens at a cap of 4,096 on 4 actors give one micro-batch of 6,000 tokens.

:func:`install` replaces both methods on their classes (every instance, present and future,
uses seqbal's). The training step plans each step with :func:`seqbal.plan_micro_batches` over
the data-parallel group: the cap is strict, the count is agreed in two all-reduces, and an error
on one rank (a sample over the cap) is agreed before any rank raises, so none is left waiting in
a collective. OpenRLHF's bookkeeping of the step (``dynamic_sample_loss_scale``,
``dynamic_batch_num_tokens``, ``dynamic_global_batch_size``, ``dynamic_optimizer_step``) is
computed exactly as OpenRLHF computes it, on seqbal's micro-batches. The rollout split rounds
the count *up* to a multiple of the actor count, under the cap; where the samples are too few
for that (five samples that need five micro-batches cannot fill eight), it raises a
``ValueError`` with the numbers instead of an over-cap split. Every collective tensor goes on
the device the group's backend needs (:mod:`seqbal.collectives`), not on
``torch.cuda.current_device()``, so the same code runs with gloo on CPUs and NCCL on GPUs.

OpenRLHF is imported only when :func:`install` runs; without it, ``install()`` raises an
``ImportError`` that says so. The replacements are wrappers of this module's own, so
:func:`uninstall` restores OpenRLHF's methods exactly where seqbal's are still bound.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, ContextManager, Optional, Sequence

from ._patching import Patch, installed_while, undo_all
from ._settings import PlanSettings

__all__ = [
    "install",
    "uninstall",
    "installed",
    "is_installed",
    "setup_dynamic_batch",
    "split_rollout_samples",
    "assign_to_actors",
    "plan_rollout_split",
    "training_cap",
    "rollout_cap",
    "effective_actor_count",
]

#: The OpenRLHF modules and classes whose methods seqbal replaces.
REPLAY_BUFFER_MODULE = "openrlhf.trainer.ppo_utils.replay_buffer"
EXPERIENCE_MAKER_MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
_TARGETS = (
    (REPLAY_BUFFER_MODULE, "NaiveReplayBuffer", "setup_dynamic_batch"),
    (EXPERIENCE_MAKER_MODULE, "RemoteExperienceMaker", "split_rollout_samples"),
)

_patches: list[Patch] = []
# The functions install() binds, made once per process (see seqbal.integrations._patching).
_wrappers: dict[str, Any] = {}
# What install() was given: forwarded to every plan the installed methods make.
_settings: list[PlanSettings] = [PlanSettings()]


def _wrapper(name: str) -> Any:
    if name not in _wrappers:
        target = {"setup_dynamic_batch": setup_dynamic_batch, "split_rollout_samples": split_rollout_samples}[name]
        order = name == "setup_dynamic_batch"  # the rollout split keeps its own order (actor chunks)
        _wrappers[name] = functools.wraps(target)(
            lambda *args, _target=target, _order=order, **kwargs: _target(*args, **_settings[0].merged(kwargs, _order))
        )
    return _wrappers[name]


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"seqbal.integrations.openrlhf needs OpenRLHF (tested with openrlhf 0.11.2): importing {module_name} "
            f"failed with {type(error).__name__}: {error}"
        ) from error


def install(*, workload_fn: Optional[Any] = None, micro_batch_order: str = "pipeline") -> list[tuple[str, str]]:
    """Make the running OpenRLHF plan its micro-batches with seqbal. Idempotent.

    Replaces ``NaiveReplayBuffer.setup_dynamic_batch`` with :func:`setup_dynamic_batch` and
    ``RemoteExperienceMaker.split_rollout_samples`` with :func:`split_rollout_samples`. Call it
    in every process that plans: the driver (the rollout split) and each Ray actor (the training
    step); see docs/openrlhf.md for the Ray hook that does the latter.

    Args:
        workload_fn: what both plans balance (lengths -> non-negative workloads, see
            :func:`seqbal.plan_micro_batches`); default None: :func:`seqbal.calculate_workload`.
            Every rank must install the same model. A later ``install`` replaces it.
        micro_batch_order: the order of each training step's micro-batches: ``"pipeline"``
            (default) or ``"largest_first"``. The rollout split keeps its own order (the
            actors' contiguous chunks).

    Returns:
        the ``(class, method)`` pairs that now point to seqbal.

    Raises:
        ImportError: OpenRLHF is not installed (or one of its modules fails to import).
        ValueError: ``workload_fn`` is not a workload model, or ``micro_batch_order`` is unknown.

    Examples:
        >>> from seqbal.integrations import openrlhf as seqbal_openrlhf
        >>> seqbal_openrlhf.install()  # doctest: +SKIP
        [('NaiveReplayBuffer', 'setup_dynamic_batch'), ('RemoteExperienceMaker', 'split_rollout_samples')]
    """
    settings = PlanSettings.checked(workload_fn, micro_batch_order)
    classes = [(getattr(_import(module), cls), method) for module, cls, method in _TARGETS]
    _settings[0] = settings
    if not _patches:
        for cls, method in classes:
            if vars(cls)[method] is not _wrapper(method):
                _patches.append(Patch(cls, method, _wrapper(method)))
    changed = []
    for patch in _patches:
        changed.extend(patch.apply())
    return changed


def uninstall() -> list[tuple[str, str]]:
    """Undo :func:`install`: OpenRLHF's own methods are bound again where seqbal's are. Does
    nothing if seqbal is not installed.

    Returns:
        the ``(class, method)`` pairs that point to OpenRLHF's methods again.
    """
    changed = undo_all(_patches)
    _patches.clear()
    _settings[0] = PlanSettings()
    return changed


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    return bool(_patches)


def installed(*, workload_fn: Optional[Any] = None, micro_batch_order: str = "pipeline") -> ContextManager[list[tuple[str, str]]]:
    """``with installed(): ...`` runs the block with seqbal installed (with :func:`install`'s
    arguments), then uninstalls it (if it was not installed before the block)."""
    return installed_while(lambda: install(workload_fn=workload_fn, micro_batch_order=micro_batch_order),
                           uninstall, is_installed)


# ---------------------------------------------------------------------------------------------
# The training step
# ---------------------------------------------------------------------------------------------


def training_cap(args: Any) -> int:
    """The token cap of one training micro-batch on one data-parallel rank:
    ``train.max_tokens_per_gpu x ds.ring_attn_size x ds.tensor_parallel_size`` (a micro-batch is
    split over the ring-attention and tensor-parallel ranks that share it)."""
    return int(args.train.max_tokens_per_gpu) * int(args.ds.ring_attn_size) * int(args.ds.tensor_parallel_size)


def setup_dynamic_batch(buffer: Any, strategy: Any, *, workload_fn: Optional[Any] = None,
                        micro_batch_order: str = "pipeline") -> None:
    """``NaiveReplayBuffer.setup_dynamic_batch`` with seqbal's plan: the buffer's samples split
    into training steps of ``train.batch_size / dp`` samples, each step into micro-batches under
    :func:`training_cap`, the count of each step equal on every rank of the data-parallel group.

    Sets on ``buffer`` what OpenRLHF's training loop reads, computed as OpenRLHF 0.11.2 computes
    it: ``dynamic_indices`` (one list of buffer indices per micro-batch, step after step),
    ``sample_batch_size = 1``, and per micro-batch ``dynamic_sample_loss_scale`` (its share of
    the step's samples), ``dynamic_batch_num_tokens`` (the step's action tokens over the group),
    ``dynamic_global_batch_size`` (the step's samples with an action token, over the group) and
    ``dynamic_optimizer_step`` (1 on the step's last micro-batch). ``workload_fn`` and
    ``micro_batch_order`` are :func:`seqbal.plan_micro_batches`'s (installed: :func:`install`'s).

    Checked before any collective: every sample's ``total_length`` (one non-negative integer)
    and ``action_mask`` (a tensor whose sum is the action tokens); OpenRLHF's bookkeeping reads
    only these values, so nothing after the plan can fail on one rank alone.

    Collectives on the data-parallel group, on the device its backend needs: one MIN of the
    number of steps (which also carries a malformed sample), two all-reduces per step for the
    plan, one SUM per step for the bookkeeping. Cost: O(n log n) per step plus the
    partitioning.

    Raises:
        ValueError: (:class:`seqbal.MicroBatchPlanError`) a malformed sample, a sample over the
            cap, or a count no rank can form, on any rank: every rank raises, at the same step
            (a malformed sample before the first), the failing rank with the sample's index and
            its numbers, its peers naming that rank and index; ``train.batch_size`` smaller than
            the group (a configuration error, the same on every rank, raised before any
            collective).
    """
    import torch
    import torch.distributed as dist

    from ..collectives import _collective_device, global_rank
    from ..plan import MicroBatchPlanError, plan_micro_batches

    args = strategy.args
    cap = training_cap(args)
    dp_group = strategy.ds_device_mesh["dp"].get_group()
    dp_size = dist.get_world_size(group=dp_group)
    local_train_batch_size = args.train.batch_size // dp_size
    if local_train_batch_size < 1:
        raise ValueError(
            f"train.batch_size={args.train.batch_size} is smaller than the data-parallel group "
            f"({dp_size} ranks): no rank would get a sample"
        )
    device = _collective_device(dp_group)
    # Every read of the buffer's samples happens here, before the first collective: a malformed
    # sample on one rank travels in the step-count all-reduce, so every rank raises together.
    sample_lengths, action_tokens, problem = _read_samples(buffer.items)
    # As OpenRLHF: a short buffer (async rollouts) gives fewer steps; every rank runs the fewest.
    expected_num_steps = args.rollout.batch_size * args.rollout.n_samples_per_prompt // args.train.batch_size
    local_steps = min(expected_num_steps, len(sample_lengths) // local_train_batch_size)
    # MIN of [steps, failure]: failure is (sample index * dp_size + rank) on a failing rank and
    # beyond every such value elsewhere, so the MIN names the failing rank with the lowest index.
    failure = _NO_FAILURE if problem is None else problem[0] * dp_size + dist.get_rank(group=dp_group)
    agreed = torch.tensor([local_steps if problem is None else 0, failure], dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=dp_group)
    num_steps, failure = (int(value) for value in agreed.cpu().tolist())
    if problem is not None:
        raise MicroBatchPlanError(f"OpenRLHF setup_dynamic_batch: {problem[1]}", MicroBatchPlanError.BAD_BATCH)
    if failure != _NO_FAILURE:
        index, rank = divmod(failure, dp_size)
        world_rank = global_rank(dp_group, rank)
        where = f"rank {rank} of the data-parallel group" + ("" if world_rank == rank else f" (global rank {world_rank})")
        raise MicroBatchPlanError(
            f"OpenRLHF setup_dynamic_batch: {where} failed: its replay buffer sample {index} is malformed "
            f"(see that rank's error); this rank's samples were valid",
            MicroBatchPlanError.BAD_BATCH,
        )

    buffer.dynamic_indices = []
    buffer.sample_batch_size = 1
    buffer.dynamic_sample_loss_scale = []
    buffer.dynamic_batch_num_tokens = []
    buffer.dynamic_global_batch_size = []
    buffer.dynamic_optimizer_step = []
    for step in range(num_steps):
        start = step * local_train_batch_size
        lengths = sample_lengths[start : start + local_train_batch_size]
        try:
            parts = plan_micro_batches(lengths, cap, dp_group=dp_group, workload_fn=workload_fn,
                                       micro_batch_order=micro_batch_order)
        except MicroBatchPlanError as error:
            raise MicroBatchPlanError(
                f"OpenRLHF training step {step} (buffer samples {start}..{start + len(lengths) - 1}, cap "
                f"train.max_tokens_per_gpu={args.train.max_tokens_per_gpu} x ring_attn_size={args.ds.ring_attn_size} "
                f"x tensor_parallel_size={args.ds.tensor_parallel_size} = {cap}): {error}",
                error.code,
            ) from error
        partitions = [[start + i for i in part] for part in parts]
        buffer.dynamic_indices.extend(partitions)
        # OpenRLHF's own bookkeeping, on seqbal's micro-batches.
        members = [idx for part in partitions for idx in part]
        tokens = [action_tokens[idx] for idx in members]
        totals = torch.tensor(
            [float(sum(count > 0 for count in tokens)), float(sum(tokens))],
            dtype=torch.float64,
            device=device,
        )
        dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=dp_group)
        global_valid_samples, global_num_tokens = totals.cpu().tolist()
        buffer.dynamic_sample_loss_scale.extend(len(part) / len(members) for part in partitions)
        buffer.dynamic_batch_num_tokens.extend([global_num_tokens] * len(partitions))
        buffer.dynamic_global_batch_size.extend([global_valid_samples] * len(partitions))
        buffer.dynamic_optimizer_step.extend([0] * (len(partitions) - 1) + [1])


# Above every (sample index * dp_size + rank) of a failing rank: int64's largest value.
_NO_FAILURE = 2**63 - 1


def _one_number(value: Any) -> Any:
    """The number a one-element tensor (or a plain number) holds; raises if there is not one."""
    if hasattr(value, "numel"):
        if value.numel() != 1:
            raise ValueError(f"a tensor of shape {tuple(value.shape)}, not one number")
        return value.item()
    if value is None:
        raise ValueError("None")
    return value


def _read_samples(items: Sequence[Any]) -> tuple[list[int], list[int], Any]:
    """Each sample's ``total_length`` and action tokens (``action_mask.sum()``), as OpenRLHF's
    step reads them, checked: ``(lengths, action_tokens, problem)`` where ``problem`` is None or
    ``(index, message)`` for the first malformed sample. Never raises (the caller must still
    join the step-count all-reduce). O(tokens of the action masks)."""
    from ..validation import is_int

    lengths: list[int] = []
    tokens: list[int] = []
    for index, sample in enumerate(items):
        try:
            length = _one_number(getattr(sample, "total_length", None))
            if not is_int(length) or length < 0:
                raise ValueError(f"{length!r}, not a non-negative integer")
        except Exception as error:  # noqa: BLE001 - any unreadable length is this sample's problem
            return lengths, tokens, (index, f"replay buffer sample {index}: total_length must hold one non-negative integer, got {error}")
        mask = getattr(sample, "action_mask", None)
        try:
            if mask is None or not hasattr(mask, "sum"):
                raise ValueError(f"got {'None' if mask is None else type(mask).__name__}")
            count = _one_number(mask.sum())
        except Exception as error:  # noqa: BLE001
            return lengths, tokens, (index, f"replay buffer sample {index}: action_mask must be a tensor of the response's tokens, {error}")
        lengths.append(int(length))
        tokens.append(int(count))
    return lengths, tokens, None


# ---------------------------------------------------------------------------------------------
# The rollout split
# ---------------------------------------------------------------------------------------------


def assign_to_actors(parts: Sequence[Sequence[int]], lengths: Sequence[int], actors: int, *,
                     workload_fn: Optional[Any] = None) -> list[list[int]]:
    """Order micro-batches so that OpenRLHF's round of ``actors`` equal contiguous chunks
    (``RayActorGroup.async_run_method_batch``) gives every actor about the same work.

    ``len(parts)`` must be a multiple of ``actors``; each actor gets ``len(parts) / actors``
    micro-batches: heaviest first (by ``workload_fn``, default :func:`seqbal.calculate_workload`),
    each to the actor with the least work that still has room. O(k log k + k x actors) for k micro-batches.

    Returns:
        the micro-batches, actor 0's first, then actor 1's, ...

    Examples:
        >>> assign_to_actors([[0], [1], [2], [3]], [9, 1, 8, 2], actors=2)
        [[0], [1], [2], [3]]
    """
    import numpy as np

    from ..workload import checked_workloads

    per_actor = len(parts) // actors
    work = [float(checked_workloads(np.asarray([lengths[i] for i in part], dtype=np.int64), workload_fn).sum())
            for part in parts]
    loads = [0.0] * actors
    shares: list[list[list[int]]] = [[] for _ in range(actors)]
    for j in sorted(range(len(parts)), key=lambda j: (-work[j], j)):
        actor = min((a for a in range(actors) if len(shares[a]) < per_actor), key=lambda a: (loads[a], a))
        shares[actor].append(list(parts[j]))
        loads[actor] += work[j]
    return [part for share in shares for part in share]


def rollout_cap(args: Any) -> int:
    """The token cap of one rollout micro-batch (the forward passes that make experiences):
    ``rollout.max_tokens_per_gpu x ds.ring_attn_size x ds.tensor_parallel_size``."""
    return int(args.rollout.max_tokens_per_gpu) * int(args.ds.ring_attn_size) * int(args.ds.tensor_parallel_size)


def effective_actor_count(args: Any) -> int:
    """OpenRLHF's effective actor count: ``actor.num_nodes x actor.num_gpus_per_node /
    ring_attn_size / tensor_parallel_size`` (ranks that share a micro-batch count once)."""
    return (
        int(args.actor.num_nodes) * int(args.actor.num_gpus_per_node) // int(args.ds.ring_attn_size) // int(args.ds.tensor_parallel_size)
    )


def plan_rollout_split(lengths: Sequence[int], cap: int, actors: int, *,
                       workload_fn: Optional[Any] = None) -> list[list[int]]:
    """The rollout split's plan: micro-batches under ``cap``, their count the smallest multiple of
    ``actors`` seqbal can fill, ordered for OpenRLHF's contiguous chunks (:func:`assign_to_actors`),
    balanced on ``workload_fn`` (default :func:`seqbal.calculate_workload`).

    Raises:
        ValueError: (:class:`seqbal.MicroBatchPlanError`) ``lengths`` not a 1-D sequence of
            non-negative integers, ``actors`` not a positive int (a NumPy integer is one), a
            sample over the cap, or too few samples for a multiple of ``actors`` under the cap;
            the message names the argument, or gives the samples, tokens, cap and actor count.

    Examples:
        >>> plan_rollout_split([3000, 3000, 1000, 1000], 4096, actors=2)
        [[0, 3], [1, 2]]
        >>> plan_rollout_split([3000] * 5, 4096, actors=4)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        seqbal.plan.MicroBatchPlanError: OpenRLHF's rollout split: 5 samples, 15000 tokens (longest 3000) at cap 4096 on 4 effective actors (the count must be a multiple of 4): Cannot satisfy ...
    """
    from ..plan import MicroBatchPlanError, plan_micro_batches
    from ..validation import int_argument, int_array

    try:
        actors = int_argument("actors (the effective actor count)", actors)
        lengths = int_array(lengths, "lengths", samples=True)
    except ValueError as error:  # the numbers below cannot be formatted from what was passed
        raise MicroBatchPlanError(f"OpenRLHF's rollout split: {error}", MicroBatchPlanError.BAD_ARGUMENT) from error
    try:
        parts = plan_micro_batches(lengths, cap, num_batches_divided_by=actors, use_dynamic_bsz_balance=False,
                                   workload_fn=workload_fn)
    except MicroBatchPlanError as error:
        longest = int(lengths.max()) if len(lengths) else 0
        raise MicroBatchPlanError(
            f"OpenRLHF's rollout split: {len(lengths)} samples, {int(lengths.sum())} tokens (longest {longest}) at cap "
            f"{cap!r} on {actors} effective actors (the count must be a multiple of {actors}): {error}",
            error.code,
        ) from error
    return assign_to_actors(parts, lengths, actors, workload_fn=workload_fn)


def split_rollout_samples(maker: Any, rollout_samples: list[Any], *, workload_fn: Optional[Any] = None) -> list[Any]:
    """``RemoteExperienceMaker.split_rollout_samples`` with seqbal's plan for dynamic batches:
    every micro-batch within :func:`rollout_cap`, the count a multiple of the effective actor
    count rounded *up* (OpenRLHF's own rounds down, over the cap), the chunks each actor gets
    balanced (:func:`assign_to_actors`). Without ``train.dynamic_batch_enable`` OpenRLHF's own
    method runs. Each micro-batch is ``Experience.concat_experiences`` of its samples, with
    ``sample.index = [i]`` set first, as OpenRLHF does. ``workload_fn``: what the split balances
    (installed: :func:`install`'s).

    Raises:
        ValueError: (:class:`seqbal.MicroBatchPlanError`) a sample over the cap, or too few
            samples for a multiple of the actor count; see :func:`plan_rollout_split`.
    """
    args = maker.args
    if not args.train.dynamic_batch_enable:
        for patch in _patches:  # OpenRLHF's own method, also while installed
            if patch.name == "split_rollout_samples":
                return patch.original(maker, rollout_samples)
        raise RuntimeError("seqbal.integrations.openrlhf.split_rollout_samples needs install() for fixed-size batches")
    experience = _import(EXPERIENCE_MAKER_MODULE).Experience
    for i, sample in enumerate(rollout_samples):
        sample.index = [i]
    lengths = [int(sample.total_length.item()) for sample in rollout_samples]
    parts = plan_rollout_split(lengths, rollout_cap(args), effective_actor_count(args), workload_fn=workload_fn)
    pad_token_id = maker.tokenizer.pad_token_id
    return [experience.concat_experiences([rollout_samples[i] for i in part], pad_token_id) for part in parts]
