"""Moved to :mod:`seqbal.cli.kk_loop`, the command line's own module; this name keeps old imports working.

``from seqbal._kk_loop import name`` gives ``seqbal.cli.kk_loop``'s own object (looked up there on
each access, PEP 562), so nothing is copied and nothing can drift. New code imports from
``seqbal.cli.kk_loop``.
"""

from typing import Any

from .cli import kk_loop as _moved


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)


def __dir__() -> list:
    return dir(_moved)
