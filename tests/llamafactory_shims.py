"""Import shims for running llamafactory 0.9.5 on a CPU-only torch in tests.

llamafactory imports ``torchaudio`` at module level (``llamafactory/data/mm_plugin.py``) but uses
it only for audio inputs. PyPI's torchaudio wheel is a CUDA build that cannot load next to the
CPU torch the tests install, so the tests do not install it: :func:`stub_torchaudio` puts an
empty module in its place before llamafactory is imported. Audio data would fail loudly (the
stub has no attributes); text-only SFT, which the tests run, never touches it.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def stub_torchaudio() -> None:
    """Register an empty ``torchaudio`` module unless a real one imports. Call before importing
    llamafactory. Idempotent."""
    if "torchaudio" in sys.modules:
        return
    try:
        import torchaudio  # noqa: F401
    except Exception:  # missing, or a build that does not load with this torch
        stub = types.ModuleType("torchaudio")
        # transformers probes installed packages with importlib.util.find_spec, which needs a spec
        stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = stub
