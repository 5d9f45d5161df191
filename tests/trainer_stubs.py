"""Test-only stand-ins for the GPU-only packages OpenRLHF imports at module level.

OpenRLHF 0.11.2's ``experience_maker`` imports ``openrlhf.trainer.ray`` (whose ``__init__``
imports vLLM) and ``openrlhf.models`` (which imports flash-attn): neither installs on a CPU
machine, and neither is used by the code under test (the rollout split and the replay buffer).
The tests register empty modules under those names only while importing OpenRLHF's modules,
then remove them again, so that no other test (verl's picks flash-attn's functions when
flash-attn imports) sees a stand-in; seqbal itself never does any of this.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def _module(name: str, added: list, **attributes) -> None:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    for key, value in attributes.items():
        setattr(module, key, value)
    if name not in sys.modules:
        sys.modules[name] = module
        added.append(name)


def import_openrlhf_modules() -> None:
    """Import OpenRLHF's experience maker and replay buffer with the stand-ins in place for the
    duration of the import only.

    Raises:
        ImportError: OpenRLHF is absent (then nothing is registered).
    """
    import openrlhf.trainer  # noqa: F401 - the real package first: no stand-ins without OpenRLHF

    added: list = []
    try:
        try:
            import flash_attn  # noqa: F401 - the real one, where it exists
        except ImportError:
            _module("flash_attn", added)
            _module("flash_attn.bert_padding", added, index_first_axis=None, pad_input=None, rearrange=None, unpad_input=None)
            _module("flash_attn.utils", added)
            _module("flash_attn.utils.distributed", added, all_gather=None)
        try:
            import vllm  # noqa: F401
        except ImportError:
            _module("openrlhf.trainer.ray", added)
            _module("openrlhf.trainer.ray.launcher", added, RayActorGroup=object)
        import openrlhf.trainer.ppo_utils.experience_maker  # noqa: F401
        import openrlhf.trainer.ppo_utils.replay_buffer  # noqa: F401
    finally:
        for name in added:
            sys.modules.pop(name, None)
