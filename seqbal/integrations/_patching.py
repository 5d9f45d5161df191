"""Bind and unbind seqbal's functions inside a trainer, undoably: the shared part of the adapters.

A trainer method lives on a class (OpenRLHF's ``NaiveReplayBuffer.setup_dynamic_batch``); a
trainer function lives in a module and may have been copied into other modules by
``from ... import`` (AReaL's ``allocate_balanced_mbs_synced``); a plug-in lives in a registry
dict (LLaMA-Factory's ``BatchingPlugin._registry[strategy]``). :class:`Patch` replaces an
attribute of a class or module, or an entry of a dict, and records the original; replacing *by identity* in every
loaded module reaches the copies too. Each adapter binds wrappers of its own (objects made once
per process), so :meth:`Patch.undo` restores the original only where that wrapper is still bound
and never touches what someone else put in place since.

Pure Python, no torch: importing an adapter stays cheap.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterable, Iterator


def rebind_everywhere(old: Any, new: Any, skip_prefix: str = "seqbal") -> list[tuple[str, str]]:
    """In every loaded module (but seqbal's own), rebind each attribute that *is* ``old`` to
    ``new``. O(loaded modules x their attributes).

    Returns:
        the ``(module, attribute)`` pairs changed.
    """
    changed = []
    for module_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or module_name.startswith(skip_prefix):
            continue
        for attribute, value in list(namespace.items()):
            if value is old:
                namespace[attribute] = new
                changed.append((module_name, attribute))
    return changed


class Patch:
    """One replaced attribute of a class or a module, and how to undo it.

    Args:
        owner: the class or module that holds the attribute, or the dict that holds the entry.
        name: the attribute's name (the entry's key).
        wrapper: what to bind instead (a function object of the adapter's own).
        everywhere: for a module function, also rebind every loaded module that holds the
            original under any name (``from module import name`` copies it).
        label: how the owner is named in the returned pairs; default its ``__qualname__`` or
            ``__name__`` (a dict has neither: give one).
    """

    def __init__(self, owner: Any, name: str, wrapper: Any, everywhere: bool = False, label: str = "") -> None:
        self.owner = owner
        self.name = name
        self.wrapper = wrapper
        self.everywhere = everywhere
        self.label = label
        self.original = self._namespace()[name]

    def _namespace(self) -> Any:
        # vars() gives a class's own attribute (not an inherited one), and a module's
        return self.owner if isinstance(self.owner, dict) else vars(self.owner)

    def _bind(self, value: Any) -> None:
        if isinstance(self.owner, dict):
            self.owner[self.name] = value
        else:
            setattr(self.owner, self.name, value)

    @property
    def where(self) -> str:
        return self.label or getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", repr(self.owner))

    def apply(self) -> list[tuple[str, str]]:
        """Bind the wrapper; returns the ``(owner, attribute)`` pairs now pointing to it."""
        changed = []
        if self.everywhere:
            changed = rebind_everywhere(self.original, self.wrapper)
        if self._namespace().get(self.name) is not self.wrapper:
            self._bind(self.wrapper)
            changed.append((self.where, self.name))
        return sorted(set(changed))

    def undo(self) -> list[tuple[str, str]]:
        """Bind the original again wherever the wrapper is bound (only there)."""
        changed = []
        if self.everywhere:
            changed = rebind_everywhere(self.wrapper, self.original)
        if self._namespace().get(self.name) is self.wrapper:
            self._bind(self.original)
            changed.append((self.where, self.name))
        return sorted(set(changed))


def apply_all(patches: Iterable[Patch]) -> list[tuple[str, str]]:
    """Apply every patch, first first; returns every pair now pointing to a wrapper."""
    changed: list[tuple[str, str]] = []
    for patch in patches:
        changed.extend(patch.apply())
    return changed


def undo_all(patches: Iterable[Patch]) -> list[tuple[str, str]]:
    """Undo every patch, last first; returns every pair restored."""
    changed: list[tuple[str, str]] = []
    for patch in reversed(list(patches)):
        changed.extend(patch.undo())
    return changed


@contextlib.contextmanager
def installed_while(install: Callable[[], Any], uninstall: Callable[[], Any], is_installed: Callable[[], bool]) -> Iterator[Any]:
    """The body of every adapter's ``installed()``: run the ``with`` block with seqbal installed
    (yielding what ``install()`` returned), then uninstall it, unless it was installed before."""
    was_installed = is_installed()
    changed = install()
    try:
        yield changed
    finally:
        if not was_installed:
            uninstall()

