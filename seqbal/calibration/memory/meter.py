"""Peak bytes of one training step on its device: the meter calibration runs on.

CUDA has an exact, cheap counter: the caching allocator's peak of allocated bytes
(``torch.cuda.reset_peak_memory_stats`` then ``torch.cuda.max_memory_allocated``), the
number an out-of-memory compares against (less the allocator's fragmentation, which the
budget's margin covers). The CPU has no such counter, so the meter replays the allocator's
own record: ``torch.profiler`` with ``profile_memory=True`` logs every allocation and free
of torch's CPU allocator with its size, in order; their running sum's maximum is the peak of
bytes the step held above what was live when it began. Chosen over sampling the process RSS
(coarse, includes Python and glibc arenas that are never returned) and over a custom
allocator hook (none is public for the CPU). It costs a profiler run per step (a few times
the step's time on a small model), which is fine for a handful of probes. On the CPU the
peak is therefore relative: the bytes the step adds, not including the parameters.

The step must leave the state as it found it (for example ``optimizer.zero_grad(set_to_none=True)``
or no optimizer step at all), so that every probe starts from the same baseline.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator, Optional

__all__ = ["measure_peak", "OUT_OF_MEMORY"]


def _oom_types() -> tuple[type, ...]:
    import torch

    kinds: list[type] = [MemoryError]
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None:
        kinds.append(oom)
    return tuple(kinds)


#: Exceptions the calibration treats as "this probe does not fit" (resolved on first use).
OUT_OF_MEMORY: tuple[type, ...] = (MemoryError,)


def measure_peak(step: Callable[[], Any], device: Optional[Any] = None) -> int:
    """Peak bytes of ``step()`` on ``device`` (default: the current CUDA device if CUDA is
    available, else the CPU).

    CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats`` (absolute: parameters,
    gradients and optimizer state included). CPU: the largest sum of live bytes allocated by
    torch's CPU allocator during the step, counted from its start (module docstring).

    Raises:
        whatever ``step`` raises (an out-of-memory error included).

    Examples:
        >>> import torch
        >>> def step():
        ...     a = torch.empty(1000, dtype=torch.uint8); b = torch.empty(3000, dtype=torch.uint8)
        ...     del a
        ...     c = torch.empty(500, dtype=torch.uint8)
        >>> measure_peak(step, "cpu")
        4000
    """
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        step()
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev))
    if dev.type != "cpu":
        raise ValueError(f"measure_peak meters CUDA and CPU devices, got {dev}")
    return _cpu_peak(step)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 points at the null device inside: torch's profiler prints a line of its
    own (``USDT ... profiler_start`` / ``profiler_stop``) from C++ on every start and stop, which
    ``sys.stderr`` redirection cannot catch. Only the start and the stop are wrapped, never the
    user's step, so whatever the step prints still shows."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 to redirect: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _cpu_peak(step: Callable[[], Any]) -> int:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
    with _quiet_stderr():
        prof.start()
    try:
        step()
    finally:
        with _quiet_stderr():
            prof.stop()
    # The raw records, one per allocation (+bytes) or free (-bytes), in time order; the
    # aggregated ``prof.events()`` folds most of them into their operator and loses the order.
    changes = [
        (event.start_ns() if hasattr(event, "start_ns") else event.start_us() * 1000, event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == DeviceType.CPU
    ]
    changes.sort(key=lambda change: change[0])  # stable: records of one timestamp keep their order
    live = peak = 0
    for _, delta in changes:
        live += delta
        peak = max(peak, live)
    return int(peak)
