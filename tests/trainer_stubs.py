"""Test-only stand-ins for the GPU-only packages OpenRLHF imports at module level.

OpenRLHF 0.11.2's ``experience_maker`` imports ``openrlhf.trainer.ray`` (whose ``__init__``
imports vLLM) and ``openrlhf.models`` (which imports flash-attn): neither installs on a CPU
machine, and neither is used by the code under test (the rollout split and the replay buffer).
The tests register empty modules under those names before importing OpenRLHF; seqbal itself
never does.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def _module(name: str, **attributes) -> None:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    for key, value in attributes.items():
        setattr(module, key, value)
    sys.modules.setdefault(name, module)


def stub_openrlhf_gpu_modules() -> None:
    """Register the stand-ins (idempotent). Call before importing OpenRLHF's experience maker.

    Raises:
        ImportError: OpenRLHF is absent (then nothing is registered, so no other test sees a
            stand-in).
    """
    import openrlhf.trainer  # noqa: F401 - the real package first: no stand-ins without OpenRLHF

    try:
        import flash_attn  # noqa: F401 - the real one, where it exists
    except ImportError:
        _module("flash_attn")
        _module("flash_attn.bert_padding", index_first_axis=None, pad_input=None, rearrange=None, unpad_input=None)
        _module("flash_attn.utils")
        _module("flash_attn.utils.distributed", all_gather=None)
    try:
        import vllm  # noqa: F401
    except ImportError:
        _module("openrlhf.trainer.ray")
        _module("openrlhf.trainer.ray.launcher", RayActorGroup=object)
