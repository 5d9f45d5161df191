"""LLaMA-Factory 0.9.5 on a machine without a GPU: put this directory on ``PYTHONPATH``.

    PYTHONPATH=examples/llamafactory_cpu python examples/llamafactory_sft.py

LLaMA-Factory calls ``torch.accelerator.synchronize()`` after every distributed step, which
raises where torch finds no accelerator ("Cannot access accelerator device when none is
available" with the CPU build of torch, "Found no NVIDIA driver on your system" with the CUDA
build). Python imports this file at start-up, and where no accelerator is available it makes
that call the no-op a CPU needs; with an accelerator it changes nothing. The directory's
``torchaudio`` is an empty stand-in (see its docstring). Nothing else is changed.
"""

import torch

if not torch.accelerator.is_available():
    torch.accelerator.synchronize = lambda device=None: None
