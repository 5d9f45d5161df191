"""Seconds of one training step on its device: the clock the timing calibration runs on.

CUDA: an event recorded on the current stream before the step and one after, and the time
between them once the second has completed (``torch.cuda.Event(enable_timing=True)``): the
device's own time of the kernels the step queued, not the host's time to queue them, with
one synchronisation per timed call. The CPU: the calling thread's CPU time
(``time.thread_time``), which other processes on a shared machine do not inflate the way they
inflate wall time; it counts only the thread that runs the step, so with torch's intra-op
threads (``torch.get_num_threads() > 1``) it misses the work of the others: time with
``torch.set_num_threads(1)``, or pass ``timer=`` (e.g. a wall clock). Every probe is timed
``repeats`` times and the fastest kept: noise (another process, a page fault, a frequency
change) only ever adds time, so the minimum is the estimate least disturbed by it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

__all__ = ["time_step", "clock_name"]


def _device(device: Optional[Any]) -> Any:
    import torch

    return torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def clock_name(device: Optional[Any] = None) -> str:
    """What :func:`time_step` measures on ``device``: ``"cuda events"`` or ``"thread cpu time"``."""
    return "cuda events" if _device(device).type == "cuda" else "thread cpu time"


def time_step(step: Callable[[], Any], device: Optional[Any] = None, *, repeats: int = 1) -> float:
    """The fewest seconds of ``repeats`` calls of ``step()`` on ``device`` (default: CUDA if
    available, else the CPU), by the clock of the module docstring.

    Raises:
        ValueError: ``repeats`` < 1, or a device that is neither CUDA nor the CPU.
        whatever ``step`` raises.

    Examples:
        >>> time_step(lambda: sum(range(10_000)), "cpu", repeats=3) > 0
        True
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    dev = _device(device)
    if dev.type == "cuda":
        import torch

        best = float("inf")
        with torch.cuda.device(dev):
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(dev)
                start.record()
                step()
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) / 1e3)
        return best
    if dev.type != "cpu":
        raise ValueError(f"time_step times CUDA and CPU devices, got {dev}")
    best = float("inf")
    for _ in range(repeats):
        begin = time.thread_time()
        step()
        best = min(best, time.thread_time() - begin)
    return best
