"""CPU shims for running LLaMA-Factory 0.9.5's new trainer in tests (this directory is on
``PYTHONPATH`` only in the tests' LLaMA-Factory processes).

LLaMA-Factory calls ``torch.accelerator.synchronize()`` after every distributed step, which
raises where no accelerator exists; with none, it becomes the no-op that a CPU needs. Nothing
else is changed.
"""

import torch

if not torch.accelerator.is_available():
    torch.accelerator.synchronize = lambda device=None: None
