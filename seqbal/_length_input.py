"""Moved to :mod:`seqbal.cli.lengths`, the command line's own module; this name keeps old imports working.

``from seqbal._length_input import name`` gives ``seqbal.cli.lengths``'s own object (looked up there on
each access, PEP 562), so nothing is copied and nothing can drift. New code imports from
``seqbal.cli.lengths``.
"""

from typing import Any

from .cli import lengths as _moved


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)


def __dir__() -> list:
    return dir(_moved)
