"""An empty stand-in for torchaudio, for LLaMA-Factory's tests on this CPU-only machine.

LLaMA-Factory 0.9.5 imports torchaudio at module level (``llamafactory/data/mm_plugin.py``,
for audio inputs, which the tests never use), and the package index's torchaudio is a CUDA
build that cannot load with the CPU torch the tests run on. Only the tests put this directory
on ``PYTHONPATH``.
"""
