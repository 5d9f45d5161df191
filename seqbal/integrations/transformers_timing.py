"""Time every micro-batch of a transformers ``Trainer`` (TRL's trainers included) into a
:class:`seqbal.timing.Recorder`, with a ``TrainerCallback``.

A callback sees the trainer's step boundaries, not its inputs: ``on_step_begin`` before a
step's first micro-batch, ``on_substep_end`` after each micro-batch but the last, and
``on_pre_optimizer_step`` after the last (gradient clipping included, a cost paid once per
step). The trainer fetches a step's micro-batches before its first one runs, so the time
between two boundaries is the micro-batch's forward and backward. The lengths come from a
forward pre-hook the callback puts on the model at ``on_train_begin`` (and removes at
``on_train_end``): ``attention_mask.sum(-1)`` for padded batches, or the runs of
``position_ids`` that restart at 0 for padding-free ones. On CUDA the boundaries are events
read later (no synchronisation per micro-batch); elsewhere, the thread's CPU time.

Every ``refit_every`` optimizer steps (0: never) the callback calls ``recorder.fit(dp_group)``
on every rank at the same step (a collective) and, with ``save_to``, saves the fit as JSON.
seqbal's token-budget sampler plans a trainer's epochs when the trainer builds its dataloader,
so a fit reaches the plans of the next run (``install(..., workload_fn=TimeCalibration.load(path).workload_fn)``),
or, for a planner called every step, at once through ``recorder.workload_fn``.
transformers is imported only when :func:`timing_callback` is called.
"""

from __future__ import annotations

import time
from typing import Any, Optional

__all__ = ["timing_callback", "lengths_of"]


def lengths_of(inputs: dict[str, Any]) -> list[int]:
    """Sequence lengths of one micro-batch's model inputs: ``attention_mask.sum(-1)``, or for a
    packed row without mask the runs of ``position_ids`` that restart at 0. O(tokens).

    Raises:
        ValueError: neither ``attention_mask`` nor ``position_ids`` is given.
    """
    mask = inputs.get("attention_mask")
    if mask is not None and getattr(mask, "dim", lambda: 0)() == 2:
        return [int(v) for v in mask.sum(-1).tolist() if int(v) > 0]
    positions = inputs.get("position_ids")
    if positions is None:
        raise ValueError("the model's inputs have neither attention_mask nor position_ids: cannot tell the lengths")
    flat = positions.reshape(-1).tolist()
    starts = [i for i, p in enumerate(flat) if p == 0] or [0]
    bounds = starts + [len(flat)]
    return [b - a for a, b in zip(bounds, bounds[1:]) if b > a]


def timing_callback(recorder: Any, *, refit_every: int = 0, dp_group: Any = None, save_to: Optional[str] = None,
                    min_records: int = 8) -> Any:
    """A ``transformers.TrainerCallback`` that records every training micro-batch into ``recorder``
    (module docstring). Pass it as ``Trainer(..., callbacks=[timing_callback(recorder)])``.

    Args:
        recorder: a :class:`seqbal.timing.Recorder`.
        refit_every: refit every this many optimizer steps, on every rank alike (0: never; call
            ``recorder.fit`` yourself).
        dp_group: the data-parallel group the refit pools over (default: the default group when
            torch.distributed is initialised).
        save_to: a path to save each fit to (JSON, :meth:`seqbal.timing.TimeCalibration.save`);
            written by global rank 0.
        min_records: passed to ``recorder.fit``; a refit with fewer pooled records is skipped
            on every rank alike.

    Raises:
        ImportError: transformers is not installed.
        ValueError: ``refit_every`` < 0.
    """
    from transformers import TrainerCallback

    if isinstance(refit_every, bool) or not isinstance(refit_every, int) or refit_every < 0:
        raise ValueError(f"refit_every must be an int >= 0, got {refit_every!r}")

    class SeqbalTimingCallback(TrainerCallback):
        """Records each micro-batch's lengths and time into a seqbal Recorder."""

        def __init__(self) -> None:
            self.recorder, self.handle, self.lengths, self.mark = recorder, None, None, None
            self.cuda = False

        def on_train_begin(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            import torch

            def hook(module, positional, keywords):  # noqa: ANN001
                if self.lengths is None:  # the micro-batch's first forward: its inputs
                    inputs = dict(keywords)
                    if positional and "input_ids" not in inputs:
                        inputs["input_ids"] = positional[0]
                    try:
                        self.lengths = lengths_of(inputs)
                    except ValueError:
                        ids = inputs.get("input_ids")
                        self.lengths = [int(ids.shape[-1])] * int(ids.shape[0]) if ids is not None else None

            self.cuda = torch.device(args.device).type == "cuda"
            if model is not None:
                self.handle = model.register_forward_pre_hook(hook, with_kwargs=True)

        def _boundary(self, closes: bool) -> None:
            import torch

            if self.cuda:
                now = torch.cuda.Event(enable_timing=True)
                now.record()
            else:
                now = time.thread_time()
            if closes and self.mark is not None and self.lengths:
                if self.cuda:
                    self.recorder.record_events(self.lengths, self.mark, now)
                elif now > self.mark:
                    self.recorder.record(self.lengths, now - self.mark)
            self.mark, self.lengths = now, None

        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            self._boundary(closes=False)

        def on_substep_end(self, args, state, control, **kwargs):  # noqa: ANN001
            self._boundary(closes=True)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):  # noqa: ANN001
            self._boundary(closes=True)
            self.mark = None

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            if refit_every and state.global_step % refit_every == 0:
                import torch.distributed as dist

                group = dp_group if dp_group is not None else (
                    dist.group.WORLD if dist.is_available() and dist.is_initialized() else None)
                try:
                    fitted = self.recorder.fit(group, min_records=min_records)
                except ValueError as error:
                    if "fewer than min_records" not in str(error):
                        raise
                    return  # every rank saw the same pool: every rank skips alike
                if save_to and (not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0):
                    fitted.save(save_to)

        def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001
            if self.handle is not None:
                self.handle.remove()
                self.handle = None

    return SeqbalTimingCallback()
