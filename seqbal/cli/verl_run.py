"""Run verl's own micro-batching on ``seqbal plan``'s simulated ranks, where verl is installed.

The comparison in ``seqbal plan`` is only worth reading if the verl side is verl's code, on
the lengths the user gave: so where ``verl`` can be imported, the strict loop is verl's own
``verl.utils.seqlen_balancing.rearrange_micro_batches`` and the one pass of verl <= 0.8 is
verl's own ``get_seqlen_balanced_partitions`` (its Karmarkar-Karp is line for line the one of
verl 0.8.0) at 0.8's count. Elsewhere the CLI falls back to the re-implementation in
:mod:`seqbal.cli.kk_loop`, and says which of the two it ran.

How verl is driven, and what that costs:

* Its input is a TensorDict, built from the lengths before the clock starts: a boolean
  ``attention_mask`` of width ``longest`` (the effective length of a row is its sum) and a
  one-column ``input_ids``, which verl reads only to see that it is not nested. The timed call
  includes verl's copy of these two tensors into the micro-batches, a small part of it.
* With several simulated ranks, verl's function runs once per rank, each in a thread of this
  process, and its ``torch.distributed`` calls are served by :class:`_ThreadGroup`: an
  all-reduce waits until every rank has contributed and hands each the MAX or MIN. So the
  count agreement, the constraints all-reduce and the one all-reduce per strict-loop step are
  verl's own; only the transport is simulated. The threads run one at a time (Python's global
  lock, and verl's KK is pure Python), so the time is that of all ranks one after another,
  the same basis as seqbal's time in the report.
* verl, torch and tensordict are imported here, lazily, only when a comparison runs; importing
  verl takes seconds, which is measured apart and not counted as planning.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .kk_loop import KKLoopResult, OnePassResult, Partitioner, one_pass, strict_loop, verl_karmarkar_karp

__all__ = ["VerlCode", "VerlRun", "load_verl", "verl_strict_loop", "reimplemented_strict_loop", "one_pass_0_8"]


@dataclass
class VerlCode:
    """verl's ``seqlen_balancing`` module, imported, or why it could not be.

    Attributes:
        module: ``verl.utils.seqlen_balancing``, or None.
        version: verl's version, or None.
        import_seconds: how long importing it took (not counted as planning).
        reason: why it is None: not installed, or the import error.
    """

    module: Any = None
    version: Optional[str] = None
    import_seconds: float = 0.0
    reason: Optional[str] = None


def load_verl() -> VerlCode:
    """Import ``verl.utils.seqlen_balancing`` if verl is installed; never raises.

    verl's import logs platform warnings (no accelerator found, ...) on the root logger; they
    are silenced for the import so that they do not mix with the CLI's one-line messages.
    """
    try:
        if importlib.util.find_spec("verl") is None:
            return VerlCode(reason="verl is not installed")
    except (ImportError, ValueError) as error:  # a broken or stubbed-out ``verl`` package
        return VerlCode(reason=f"verl cannot be imported ({type(error).__name__}: {error})")
    start = time.perf_counter()
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        from importlib.metadata import version

        import verl.utils.seqlen_balancing as module

        found = getattr(__import__("verl"), "__version__", None) or version("verl")
    except Exception as error:  # noqa: BLE001 - any failure means: use the re-implementation
        return VerlCode(reason=f"verl cannot be imported ({type(error).__name__}: {error})")
    finally:
        logging.disable(previous)
    return VerlCode(module=module, version=str(found), import_seconds=time.perf_counter() - start)


class _ThreadGroup:
    """``torch.distributed`` as verl's ``rearrange_micro_batches`` uses it, for ranks that are
    threads of this process: ``is_initialized``, ``all_reduce`` (MAX, MIN) and ``ReduceOp``.

    An all-reduce is two barriers: every rank deposits its tensor, the reduction is read by all,
    and only then may a rank deposit the next one. A rank that raises aborts the barriers, so
    the ranks still waiting in an all-reduce are released (and recorded as left waiting)
    instead of hanging the CLI as they would hang a real job.
    """

    class ReduceOp:
        MAX = "max"
        MIN = "min"

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.slots: list[Any] = [None] * size
        self.local = threading.local()
        self.all_reduces = [0] * size

    def is_initialized(self) -> bool:
        return True

    def all_reduce(self, tensor: Any, op: str = "sum", group: Any = None) -> None:
        import torch

        rank = self.local.rank
        self.all_reduces[rank] += 1
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        stacked = torch.stack(self.slots)
        reduced = stacked.max(dim=0).values if op == self.ReduceOp.MAX else stacked.min(dim=0).values
        self.barrier.wait()
        tensor.copy_(reduced)


def _batch(lengths: np.ndarray) -> Any:
    """The TensorDict verl reads: a boolean mask of the lengths, and a token column."""
    import torch
    from tensordict import TensorDict

    values = torch.as_tensor(np.asarray(lengths, dtype=np.int64))
    width = max(int(values.max()), 1)
    mask = torch.arange(width)[None, :] < values[:, None]
    ids = torch.zeros(len(values), 1, dtype=torch.long)
    return TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[len(values)])


@dataclass
class VerlRun(KKLoopResult):
    """A :class:`~seqbal.cli.kk_loop.KKLoopResult` from verl's own code, with what it did.

    Attributes:
        seconds: the timed calls, all ranks.
        all_reduces: all-reduces per rank (0 with one rank: verl does not sync then).
        errors: per rank, the exception verl raised there, or None.
        left_waiting: ranks that were still waiting in an all-reduce when another rank raised.
    """

    seconds: float = 0.0
    all_reduces: int = 0
    errors: list[Optional[str]] = field(default_factory=list)
    left_waiting: list[int] = field(default_factory=list)


_REQUESTED = re.compile(r"Requested (\d+) non-empty micro-batches")


def verl_strict_loop(
    code: VerlCode,
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
) -> VerlRun:
    """verl's own ``rearrange_micro_batches`` on every simulated rank, synced when there are several.

    The KK passes are counted by wrapping verl's ``get_seqlen_balanced_partitions`` for the
    duration of the call (its module globals are restored afterwards, as are ``dist`` and
    ``get_device_name``, which point at :class:`_ThreadGroup` and the CPU while ranks are
    simulated).

    Returns:
        A :class:`VerlRun`; ``parts`` is None when verl raised on some rank (``failed_at`` is
        the count verl requested when it ran out of groups, ``errors`` says what each rank raised).
    """
    module = code.module
    batches = [_batch(lengths) for lengths in rank_lengths]
    size = len(batches)
    group = _ThreadGroup(size)
    passes = [0] * size
    kk = module.get_seqlen_balanced_partitions

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes[group.local.rank] += 1
        return kk(*args, **kwargs)

    results: list[Any] = [None] * size
    errors: list[Optional[BaseException]] = [None] * size

    def one_rank(rank: int) -> None:
        group.local.rank = rank
        try:
            results[rank] = module.rearrange_micro_batches(
                batches[rank], max_token_len, dp_group=group if size > 1 else None,
                num_batches_divided_by=num_batches_divided_by, same_micro_num_in_dp=True,
                min_num_micro_batch=min_num_micro_batch, use_dynamic_bsz_balance=True,
                force_group_size=force_group_size,
            )[1]
        except BaseException as error:  # noqa: BLE001 - recorded per rank, reported by the caller
            errors[rank] = error
            group.barrier.abort()

    saved = {name: getattr(module, name) for name in ("dist", "get_device_name", "get_seqlen_balanced_partitions")}
    module.get_seqlen_balanced_partitions = counted
    if size > 1:
        module.dist = group
        module.get_device_name = lambda: "cpu"
    try:
        start = time.perf_counter()
        if size == 1:
            one_rank(0)
        else:
            threads = [threading.Thread(target=one_rank, args=(rank,), daemon=True) for rank in range(size)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        seconds = time.perf_counter() - start
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
    waiting = [r for r, e in enumerate(errors) if isinstance(e, threading.BrokenBarrierError)]
    messages = [None if e is None else f"{type(e).__name__}: {e}" for e in errors]
    if any(e is not None for e in errors):
        match = next((_REQUESTED.search(str(e)) for e in errors if e is not None and _REQUESTED.search(str(e))), None)
        return VerlRun(parts=None, passes=max(passes), failed_at=int(match.group(1)) if match else None,
                       seconds=seconds, all_reduces=max(group.all_reduces), errors=messages, left_waiting=waiting)
    return VerlRun(parts=[[sorted(p) for p in parts] for parts in results], passes=max(passes), failed_at=None,
                   seconds=seconds, all_reduces=max(group.all_reduces), errors=messages)


def _prepare(batch: Any, g: int) -> tuple[list[int], list[int]]:
    """verl's first steps, in torch: effective lengths from the mask, workloads in int64, both
    per forced group and as Python lists."""
    lengths = batch["attention_mask"].sum(dim=1).long()
    work = 24576 * lengths + lengths**2
    if g > 1:
        return lengths.view(-1, g).sum(dim=1).tolist(), work.view(-1, g).sum(dim=1).tolist()
    return lengths.tolist(), work.tolist()


def _finish(batch: Any, parts: list[list[int]], work: list[int], g: int) -> list[list[int]]:
    """verl's last steps: pipeline order by workload (heaviest in the middle), and one
    TensorDict per micro-batch, indexed from the batch."""
    import torch

    parts = sorted(parts, key=lambda part: (sum(work[i // g] for i in part[::g]), part[0]), reverse=True)
    parts = parts[::2][::-1] + parts[1::2]
    for part in parts:
        batch[torch.tensor(part)]
    return parts


def _pipeline(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    strict: bool,
    partition: Partitioner,
    options: dict[str, Any],
) -> tuple[Any, float]:
    """verl's call, step for step, with ``partition`` as its KK: the TensorDicts are built
    untimed; the timed part is the preparation, the loop (or the one pass) and the copies."""
    g = options.get("force_group_size", 1)
    batches = [_batch(lengths) for lengths in rank_lengths]
    start = time.perf_counter()
    prepared = [_prepare(batch, g) for batch in batches]
    tokens, work = [p[0] for p in prepared], [p[1] for p in prepared]
    result = (strict_loop if strict else one_pass)(tokens, work, max_token_len, partition=partition, **options)
    if result.parts is not None:
        result.parts = [_finish(b, parts, w, g) for b, parts, w in zip(batches, result.parts, work)]
    return result, time.perf_counter() - start


def reimplemented_strict_loop(rank_lengths: Sequence[np.ndarray], max_token_len: int, **options: Any) -> VerlRun:
    """verl >= 0.9's ``rearrange_micro_batches`` re-implemented (:mod:`seqbal.cli.kk_loop`'s KK and
    loop), on the same TensorDicts and with the same torch steps, for where verl is absent.

    torch and tensordict are imported first: verl's function always runs in a process that has
    them, and its KK's millions of short-lived objects cost more there (the garbage collector
    walks a larger heap); timed in a bare process, the re-implementation would be about 2.5x
    faster than verl's own. All-reduces are simulated by the loop itself (MAX, MIN over ranks).
    """
    result, seconds = _pipeline(rank_lengths, max_token_len, True, verl_karmarkar_karp, options)
    sync = len(rank_lengths) > 1
    return VerlRun(parts=result.parts, passes=result.passes, failed_at=result.failed_at, seconds=seconds,
                   all_reduces=(2 + result.passes) if sync else 0, errors=[None] * len(rank_lengths))


def one_pass_0_8(code: Optional[VerlCode], rank_lengths: Sequence[np.ndarray], max_token_len: int,
                 **options: Any) -> tuple[OnePassResult, float]:
    """verl <= 0.8's call, step for step: 0.8's count and one KK pass, with verl's own KK
    (``get_seqlen_balanced_partitions``, identical in 0.8.0 and 0.9.1) when ``code`` holds
    it, else :func:`~seqbal.cli.kk_loop.verl_karmarkar_karp`. Returns the result and its time."""
    if code is not None and code.module is not None:
        balanced = code.module.get_seqlen_balanced_partitions
        partition: Partitioner = lambda work, k: balanced(work, k, equal_size=False)  # noqa: E731
    else:
        partition = verl_karmarkar_karp
    return _pipeline(rank_lengths, max_token_len, False, partition, options)
