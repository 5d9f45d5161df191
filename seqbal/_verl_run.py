"""Moved to :mod:`seqbal.cli.verl_run`, the command line's own module; this name keeps old imports working.

``from seqbal._verl_run import name`` gives ``seqbal.cli.verl_run``'s own object (looked up there on
each access, PEP 562), so nothing is copied and nothing can drift. New code imports from
``seqbal.cli.verl_run``.
"""

from typing import Any

from .cli import verl_run as _moved


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)


def __dir__() -> list:
    return dir(_moved)
