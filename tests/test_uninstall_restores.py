"""Every adapter's ``uninstall()`` restores what ``install()`` found, and only where seqbal's
function is still bound: a patch someone else made after ``install()`` stays in place (issue
30.5; verl's once overwrote it with verl's original).

The trainers are stand-ins (modules and classes made here, put in ``sys.modules`` for the test),
so the behaviour is tested wherever the suite runs; the adapters touch nothing but the
attributes they name.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

import pytest

from seqbal.integrations import areal as seqbal_areal
from seqbal.integrations import openrlhf as seqbal_openrlhf
from seqbal.integrations import torchtitan as seqbal_torchtitan
from seqbal.integrations import verl as seqbal_verl


def _function(name: str) -> Callable[..., Any]:
    def original(*args: Any, **kwargs: Any) -> str:
        return name

    original.__name__ = name
    return original


def _module(monkeypatch, name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


class Trainer:
    """One adapter over stand-ins: ``targets`` are (owner, attribute) pairs install() replaces;
    ``copy_of`` a module that copied the first target by ``from ... import`` (None for classes)."""

    def __init__(self, adapter: Any, targets: list[tuple[Any, str]], install: Callable[[], Any], copy_of: Any = None):
        self.adapter = adapter
        self.targets = targets
        self.install = install
        self.copy_of = copy_of

    def values(self) -> list[Any]:
        return [vars(owner)[name] for owner, name in self.targets]


def verl_trainer(monkeypatch) -> Trainer:
    names = ("rearrange_micro_batches", "restore_dynamic_batch", "get_reverse_idx", "prepare_dynamic_batch")
    module = _module(monkeypatch, seqbal_verl.VERL_MODULE, **{name: _function(name) for name in names})
    copy = _module(monkeypatch, "stand_in_engine_utils", rearrange_micro_batches=module.rearrange_micro_batches)
    return Trainer(seqbal_verl, [(module, name) for name in names], seqbal_verl.install, copy)


def openrlhf_trainer(monkeypatch) -> Trainer:
    buffer = type("NaiveReplayBuffer", (), {"setup_dynamic_batch": _function("setup_dynamic_batch")})
    maker = type("RemoteExperienceMaker", (), {"split_rollout_samples": _function("split_rollout_samples")})
    _module(monkeypatch, seqbal_openrlhf.REPLAY_BUFFER_MODULE, NaiveReplayBuffer=buffer)
    _module(monkeypatch, seqbal_openrlhf.EXPERIENCE_MAKER_MODULE, RemoteExperienceMaker=maker)
    targets = [(buffer, "setup_dynamic_batch"), (maker, "split_rollout_samples")]
    return Trainer(seqbal_openrlhf, targets, seqbal_openrlhf.install)


def areal_trainer(monkeypatch) -> Trainer:
    name = "allocate_balanced_mbs_synced"
    module = _module(monkeypatch, seqbal_areal.AREAL_MODULE, **{name: _function(name)})
    copy = _module(monkeypatch, "stand_in_areal_engine", **{name: getattr(module, name)})
    return Trainer(seqbal_areal, [(module, name)], seqbal_areal.install, copy)


def torchtitan_trainer(monkeypatch) -> Trainer:
    names = ("_assign_training_samples_to_rows", "_build_microbatch_grid")
    batcher = type("Batcher", (), {name: _function(name) for name in names})
    return Trainer(seqbal_torchtitan, [(batcher, name) for name in names], lambda: seqbal_torchtitan.install(batcher))


TRAINERS = {"verl": verl_trainer, "openrlhf": openrlhf_trainer, "areal": areal_trainer, "torchtitan": torchtitan_trainer}


@pytest.fixture(params=sorted(TRAINERS))
def trainer(request, monkeypatch):
    made = TRAINERS[request.param](monkeypatch)
    assert not made.adapter.is_installed(), "an earlier test left seqbal installed"
    yield made
    made.adapter.uninstall()


def test_install_then_uninstall_restores_every_original(trainer):
    before = trainer.values()
    copied = trainer.copy_of and vars(trainer.copy_of)[trainer.targets[0][1]]
    trainer.install()
    assert trainer.adapter.is_installed()
    assert all(now is not was for now, was in zip(trainer.values(), before))
    if trainer.copy_of is not None:  # reached through the copy too
        assert vars(trainer.copy_of)[trainer.targets[0][1]] is vars(trainer.targets[0][0])[trainer.targets[0][1]]
    assert trainer.adapter.uninstall()
    assert trainer.values() == before
    if trainer.copy_of is not None:
        assert vars(trainer.copy_of)[trainer.targets[0][1]] is copied
    assert not trainer.adapter.is_installed()


def test_uninstall_leaves_a_later_patch_in_place(trainer):
    """Someone patches the first target (and its copy) after install(): uninstall() restores
    the other targets and leaves that patch exactly where it is; a second install() then wraps
    the later patch, and its uninstall() gives that patch back."""
    before = trainer.values()
    owner, name = trainer.targets[0]
    trainer.install()
    theirs = _function("someone_elses_patch")
    setattr(owner, name, theirs)
    if trainer.copy_of is not None:
        setattr(trainer.copy_of, name, theirs)
    trainer.adapter.uninstall()
    assert trainer.values() == [theirs, *before[1:]]
    if trainer.copy_of is not None:
        assert vars(trainer.copy_of)[name] is theirs
    assert not trainer.adapter.is_installed()
    if trainer.adapter is seqbal_torchtitan:
        return  # torchtitan's install() checks the class holds its methods; theirs is one of them
    trainer.install()
    assert vars(owner)[name] is not theirs
    trainer.adapter.uninstall()
    assert trainer.values() == [theirs, *before[1:]]
