"""Fit the time model from the training run itself: every micro-batch a rank runs is a probe.

The trainer times each micro-batch it runs anyway (:meth:`Recorder.record`, or the
:meth:`Recorder.timed` context manager) and, every so many steps, :meth:`Recorder.fit` pools
the records of every data-parallel rank and fits :class:`~.model.TimeModel` on them. Every rank
must plan with the same workload, or their plans diverge (and synced ranks disagree on counts);
so the records travel, not the fits: one ``all_gather_object`` (:func:`seqbal.collectives.gather_objects`)
gives every rank the same pooled list, in rank order, and the fit is portable
(:func:`seqbal.calibration.nnls.weighted_nnls` with ``portable=True``: the same bits on every
IEEE-754 machine), so every rank gets the same coefficients without a second collective. A
record is its lengths and seconds; a rank keeps its ``max_records`` most recent, so the pool is
bounded and follows the run (a model whose kernels warm up, a changed sequence length).

On CUDA, :meth:`Recorder.timed` records two events around the micro-batch and reads their time
only when the records are needed (:meth:`Recorder.fit`, or when more than ``max_pending`` are
unread): timing a run costs no synchronisation per micro-batch.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from typing import Any, Iterator, Optional, Sequence

from .calibration import TimeCalibration, TimedProbe, fit_probes

__all__ = ["Recorder"]


class Recorder:
    """Timed micro-batches of a training run, and the time model fitted on them.

    Args:
        max_records: records kept per rank, the most recent (default 2048).
        skip: the first ``skip`` records are dropped (default 0): the first steps of a run pay
            for lazy initialisation that later steps do not.
        max_pending: CUDA event pairs left unread before the oldest are read (default 256).

    Examples:
        >>> recorder = Recorder()
        >>> for lengths, seconds in [([100], 0.0011), ([100] * 8, 0.0082), ([800], 0.0093), ([400, 400], 0.0085)]:
        ...     recorder.record(lengths, seconds)
        >>> fitted = recorder.fit(min_records=4)  # no dp_group: this rank's records
        >>> len(fitted.probes), fitted.source
        (4, 'recorder')
        >>> fitted.predict([400, 400]) > fitted.predict([100])
        True
    """

    def __init__(self, *, max_records: int = 2048, skip: int = 0, max_pending: int = 256) -> None:
        for name, value, low in (("max_records", max_records, 2), ("skip", skip, 0), ("max_pending", max_pending, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.max_records, self.skip, self.max_pending = max_records, skip, max_pending
        self._records: deque[tuple[tuple[int, ...], float]] = deque(maxlen=max_records)
        self._pending: deque[tuple[tuple[int, ...], Any, Any]] = deque()
        self._seen = 0

    def __len__(self) -> int:
        """Records kept on this rank (pending CUDA timings included)."""
        return len(self._records) + len(self._pending)

    def record(self, lengths: Sequence[int], seconds: float) -> None:
        """Add one micro-batch: its sequence lengths and the seconds it took. O(n).

        Raises:
            ValueError: no length, a length < 1, or seconds not a positive finite number.
        """
        values = tuple(int(s) for s in (lengths.tolist() if hasattr(lengths, "tolist") else lengths))
        if not values or min(values) < 1:
            raise ValueError(f"a record needs one or more lengths >= 1, got {list(values)[:8]}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) and not hasattr(seconds, "__float__"):
            raise ValueError(f"seconds must be a number, got {seconds!r}")
        seconds = float(seconds)
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds must be positive and finite, got {seconds} for lengths {list(values)[:8]}")
        self._seen += 1
        if self._seen > self.skip:
            self._records.append((values, seconds))

    @contextlib.contextmanager
    def timed(self, lengths: Sequence[int], device: Optional[Any] = None) -> Iterator[None]:
        """Time the block as one micro-batch of ``lengths``: CUDA events on a CUDA ``device``
        (read later, no synchronisation here), else the thread's CPU time. The block's time is
        recorded only if it returns normally.

        >>> recorder = Recorder()
        >>> with recorder.timed([3, 5], device="cpu"):
        ...     _ = sum(range(100_000))
        >>> len(recorder)
        1
        """
        values = tuple(int(s) for s in (lengths.tolist() if hasattr(lengths, "tolist") else lengths))
        import torch

        dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending.append((values, start, end))
            while len(self._pending) > self.max_pending:
                self._read_one()
            return
        begin = time.thread_time()
        yield
        self.record(values, time.thread_time() - begin)

    def _read_one(self) -> None:
        values, start, end = self._pending.popleft()
        end.synchronize()
        self.record(values, start.elapsed_time(end) / 1e3)

    def records(self) -> list[tuple[tuple[int, ...], float]]:
        """This rank's records, oldest first (pending CUDA timings read first)."""
        while self._pending:
            self._read_one()
        return list(self._records)

    def clear(self) -> None:
        """Drop every record (for example after the model or the sequence length changed)."""
        self._records.clear()
        self._pending.clear()

    def fit(self, dp_group: Optional[Any] = None, *, min_records: int = 8) -> TimeCalibration:
        """Pool every rank's records and fit the time model on them, the same on every rank.

        Args:
            dp_group: the data-parallel ``ProcessGroup`` whose ranks pool their records (one
                ``all_gather_object``); None (or torch.distributed not initialised): this rank's
                records only.
            min_records: fewest pooled records to fit on (default 8).

        Returns:
            A :class:`TimeCalibration` (``source="recorder"``) whose model, and so whose
            ``workload_fn``, is bit for bit the same on every rank of ``dp_group``.

        Raises:
            ValueError: fewer than ``min_records`` records in the pool (on every rank alike:
                every rank sees the same pool).

        Complexity: one collective carrying every rank's records; a fit of O(16 * records).
        """
        local = self.records()
        pooled, where = local, "this rank"
        if dp_group is not None:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                from ...collectives import gather_objects

                everyone = gather_objects(local, dp_group)
                pooled = [record for rank in everyone for record in rank]
                where = f"ranks:{len(everyone)}"
        if len(pooled) < max(2, min_records):
            raise ValueError(f"the recorder holds {len(pooled)} record(s) on {where}, fewer than min_records "
                             f"{max(2, min_records)}: record more micro-batches before fitting")
        probes = [TimedProbe(lengths, seconds, "recorded") for lengths, seconds in pooled]
        return fit_probes(probes, device=where if where != "this rank" else "local", clock="recorded",
                          repeats=1, warmup=0, source="recorder")
