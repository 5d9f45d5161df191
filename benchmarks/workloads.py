"""Deterministic length generators for the benchmark, plus the real length lists.

Every generator is ``f(n, cap, seed) -> (lengths, force_group_size)`` with lengths an int64
array whose every sample (and every forced group) fits under ``cap``, so every case is
solvable. Seeds are fixed per (family, n, cap) by :func:`case_seed`, so a rerun sees the same
numbers on every machine (NumPy's PCG64 stream is stable across platforms and versions).

The real lists (tokenised with Mistral Tekken, see ``shared/data/lengths/README.md``) live
outside the repository, in ``<repo>/../shared/data/lengths``; if that directory is absent the
real families are skipped and the table says so.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Callable, Optional

import numpy as np

Generator = Callable[[int, int, int], "tuple[np.ndarray, int]"]

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where the real length lists are looked for, in order.
#: ``SEQBAL_LENGTHS_DIR`` overrides; then ``<clone>/../shared`` (CI) and two levels up (a git
#: worktree under ``<project>/wt/<name>``).
REAL_DATA_DIRS = tuple(
    Path(p)
    for p in (
        os.environ.get("SEQBAL_LENGTHS_DIR", ""),
        REPO_ROOT.parent / "shared" / "data" / "lengths",
        REPO_ROOT.parent.parent / "shared" / "data" / "lengths",
    )
    if str(p)
)
REAL_FILES = {
    "real_gsm8k": "gsm8k_train.txt",
    "real_alpaca_eval": "alpaca_eval_outputs.txt",
    "real_codealpaca": "codealpaca.txt",
    "real_math": "math_test.txt",
    "real_qwen_rollouts": "qwen25math_cot_rollouts.txt",
}
#: Families whose inputs are built to defeat packing heuristics; excluded from the
#: mean-overshoot target, reported separately.
ADVERSARIAL = ("adv_half_cap", "adv_7_of_8")


def case_seed(family: str, n: int, cap: int) -> int:
    return zlib.crc32(f"{family}/{n}/{cap}".encode())


def _clip(lengths: np.ndarray, cap: int) -> np.ndarray:
    return np.clip(np.rint(lengths), 1, cap).astype(np.int64)


def lognormal(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
    """Prompt + response, both lognormal (medians 300 and 600 tokens), clipped to the cap."""
    rng = np.random.default_rng(seed)
    prompt = np.minimum(rng.lognormal(np.log(300), 0.6, n), 2048)
    response = rng.lognormal(np.log(600), 0.9, n)
    return _clip(prompt + response, cap), 1


def bimodal_rl(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
    """RL rollouts: most responses short, a quarter truncated at the maximum response length."""
    rng = np.random.default_rng(seed)
    max_prompt = 512
    max_response = min(cap - max_prompt, 8192)
    prompt = rng.integers(64, max_prompt + 1, n)
    response = np.minimum(rng.lognormal(np.log(400), 0.5, n), max_response)
    truncated = rng.random(n) < 0.25
    response = np.where(truncated, max_response, response)
    return _clip(prompt + response, cap), 1


def pareto(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
    """Heavy tail: 64 + 200 * Pareto(1.5), clipped to the cap."""
    rng = np.random.default_rng(seed)
    return _clip(64 + 200 * rng.pareto(1.5, n), cap), 1


def uniform(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
    """Uniform on [1, min(cap, 8192)]."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, min(cap, 8192) + 1, n).astype(np.int64), 1


def grpo_groups(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
    """GRPO: groups of 8 rollouts of one prompt (force_group_size 8), lengths correlated within
    a group (shared prompt, shared difficulty), each sample at most cap // 8 so a group fits."""
    group = 8
    rng = np.random.default_rng(seed)
    groups = n // group
    prompt = rng.lognormal(np.log(150), 0.5, groups)
    difficulty = rng.lognormal(np.log(350), 0.7, groups)
    response = difficulty[:, None] * rng.lognormal(0.0, 0.35, (groups, group))
    lengths = np.minimum(prompt[:, None] + response, cap // group)
    return _clip(lengths.reshape(-1), cap), group


def adv_half_cap(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
    """Adversarial: 60% of items just over half the cap (no two share a micro-batch), the rest
    small fillers up to a quarter of the cap."""
    rng = np.random.default_rng(seed)
    big = rng.random(n) < 0.6
    over_half = cap // 2 + 1 + rng.integers(0, max(cap // 64, 1), n)
    filler = rng.integers(1, cap // 4 + 1, n)
    return np.where(big, over_half, filler).astype(np.int64), 1


def adv_7_of_8(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
    """Adversarial: the 8 x 7 / cap 8 family scaled up: every item is 7/8 of the cap, so the
    ceildiv bound says 7n/8 micro-batches and the truth is n."""
    return np.full(n, cap * 7 // 8, dtype=np.int64), 1


SYNTHETIC: dict[str, Generator] = {
    "lognormal": lognormal,
    "bimodal_rl": bimodal_rl,
    "pareto": pareto,
    "uniform": uniform,
    "grpo_groups": grpo_groups,
    "adv_half_cap": adv_half_cap,
    "adv_7_of_8": adv_7_of_8,
}


def real_data_dir() -> Optional[Path]:
    """The directory holding the real length lists, or None when it is not checked out."""
    for candidate in REAL_DATA_DIRS:
        if (candidate / "README.md").exists():
            return candidate
    return None


def _load(name: str) -> np.ndarray:
    directory = real_data_dir()
    if directory is None:
        raise FileNotFoundError("real length lists not found in " + ", ".join(map(str, REAL_DATA_DIRS)))
    return np.loadtxt(directory / REAL_FILES[name], dtype=np.int64, ndmin=1)


def real(name: str) -> Generator:
    """A real list as a generator: ``n`` samples drawn (with replacement only when ``n`` exceeds
    the list) by a seeded RNG, as a shuffling data loader would; clipped to the cap."""

    def generate(n: int, cap: int, seed: int) -> tuple[np.ndarray, int]:
        source = _load(name)
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(source), size=n, replace=n > len(source))
        return np.minimum(source[picks], cap), 1

    generate.__doc__ = f"Real lengths from {REAL_FILES[name]}."
    return generate


def families(include_real: bool = True) -> dict[str, Generator]:
    """Every family to benchmark; the real ones only when their data directory exists."""
    result = dict(SYNTHETIC)
    if include_real and real_data_dir() is not None:
        result.update({name: real(name) for name in REAL_FILES})
    return result
