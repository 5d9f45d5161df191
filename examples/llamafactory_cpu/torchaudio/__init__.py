"""An empty stand-in for torchaudio, for LLaMA-Factory 0.9.5's text trainers on a CPU.

LLaMA-Factory imports torchaudio at module level (``llamafactory/data/mm_plugin.py``, for audio
inputs), and the package index's torchaudio is a CUDA build that does not load beside the CPU
build of torch. With this directory on ``PYTHONPATH`` the import succeeds and text datasets
train; an audio dataset needs a real torchaudio (a CPU build from PyTorch's CPU index), without
this directory on the path.
"""
