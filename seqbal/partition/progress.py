"""How far a long plan has come, for a caller that shows it (``seqbal plan``'s progress bar).

A plan of a whole dataset (10^7 samples) runs for minutes inside one call, so the count search
says how many items it has finished, chunk by chunk (:func:`advance`), and a caller that wants
to see it wraps the call in :func:`watching`. Nothing is threaded through the planning
functions' signatures, and where nobody watches a report costs one context-variable lookup.
The watcher is held in a :class:`contextvars.ContextVar`, so a watcher of one thread (or task)
never sees another's plans.

The unit is *items of a count search*: samples, or forced groups where ``force_group_size > 1``.
A plan may run more than one search over the same items (a count raised by the agreement, a
retry), so a watcher should treat the sum as a lower bound of the work done and clamp it.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Optional

_WATCHER: ContextVar[Optional[Callable[[int], None]]] = ContextVar("seqbal_plan_watcher", default=None)


def advance(items: int) -> None:
    """Report that a search finished ``items`` more items (no-op where nobody watches)."""
    watcher = _WATCHER.get()
    if watcher is not None and items > 0:
        watcher(int(items))


@contextmanager
def watching(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(items)`` on every :func:`advance` made inside the ``with`` block.

    >>> seen = []
    >>> with watching(seen.append):
    ...     advance(3)
    ...     advance(0)
    >>> advance(5)  # outside: nobody watches
    >>> seen
    [3]
    """
    token = _WATCHER.set(callback)
    try:
        yield
    finally:
        _WATCHER.reset(token)
