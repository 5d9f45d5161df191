"""collectives._collective_device: the device of the collective tensors follows the group's
backend (gloo -> CPU, any device backend -> the current accelerator), not the string "nccl"."""

from __future__ import annotations

import pytest
import torch

from seqbal import collectives


@pytest.fixture
def backend(monkeypatch):
    """Set the backend name ``dist.get_backend`` reports, with no process group needed."""

    def set_backend(name):
        monkeypatch.setattr(collectives.dist, "get_backend", lambda group=None: name)

    return set_backend


@pytest.fixture
def accelerator(monkeypatch):
    """Pretend the current accelerator is ``kind`` at ``index`` (None: no accelerator)."""

    def set_accelerator(kind, index=0):
        device = None if kind is None else torch.device(kind)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: device)
        monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: index)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    return set_accelerator


@pytest.mark.parametrize("name", ["gloo", "GLOO", "cpu:gloo,cuda:nccl", "mpi"])
def test_cpu_backends_use_the_cpu_even_with_an_accelerator(backend, accelerator, name):
    backend(name)
    accelerator("cuda", 1)
    assert collectives._collective_device(None) == torch.device("cpu")


@pytest.mark.parametrize(
    "name, kind, index",
    [("nccl", "cuda", 3), ("hccl", "xpu", 2), ("xccl", "xpu", 0), ("cuda:nccl", "cuda", 1)],
)
def test_device_backends_use_the_current_accelerator(backend, accelerator, name, kind, index):
    backend(name)
    accelerator(kind, index)
    assert collectives._collective_device(None) == torch.device(kind, index)


def test_without_accelerator_api_falls_back_to_cuda(backend, monkeypatch):
    backend("nccl")
    monkeypatch.delattr(torch, "accelerator")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    assert collectives._collective_device(None) == torch.device("cuda", 5)


def test_device_backend_without_any_accelerator_uses_the_cpu(backend, accelerator):
    backend("hccl")
    accelerator(None)
    assert collectives._collective_device(None) == torch.device("cpu")
