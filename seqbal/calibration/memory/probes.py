"""Probe micro-batches: the shapes a calibration meters at one token total (pure NumPy).

A calibration fits a cost (peak bytes, seconds) as a function of a micro-batch's features
(its sequences, tokens, squared lengths, longest sequence). Probes are chosen to move those
features apart at each token total ``T``: ``long`` (sequences as long as allowed: the squared
and longest terms at their largest), ``short`` (many short sequences: the per-sequence term)
and ``mixed`` (one half-``T`` sequence and eighths: the longest term apart from the sum of
squares); with the user's lengths, ``sampled`` is drawn from them (the micro-batches that will
really run), and every sequence is at most the longest of them.

This module only says *what* to run at a scale; *which* scales to run (up to a memory budget,
or a time budget) is the caller's policy. It knows nothing of torch or of the cost fitted.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

__all__ = ["SHAPES", "SHORT_COUNT", "SHORT_LENGTH", "default_probes", "longest_batch"]

#: The probe shapes, in the order a scale runs them.
SHAPES = ("long", "short", "mixed", "sampled")
#: Shortest sequence the ``short`` probes use (any lengths: a token cap's worst micro-batch may be
#: all one-token sequences), and how many sequences they hold at most.
SHORT_LENGTH, SHORT_COUNT = 1, 1024


def _pieces(total: int, piece: int) -> list[int]:
    """``total`` tokens as sequences of ``piece`` (the last one shorter, if any is left)."""
    piece = max(1, min(piece, total))
    out = [piece] * (total // piece)
    if total % piece:
        out.append(total % piece)
    return out


def default_probes(
    tokens: int, lengths: Optional[Sequence[int]] = None, *, seed: int = 0
) -> dict[str, list[int]]:
    """The probe micro-batches at a token total of ``tokens``, by shape (module docstring).

    With ``lengths``, sequences are at most the longest of them and a ``sampled`` probe is drawn
    from them (seeded, at most ``tokens`` tokens). O(tokens / shortest piece).

    >>> {shape: probe[:6] for shape, probe in default_probes(256).items()}  # short: 256 sequences of 1
    {'long': [256], 'short': [1, 1, 1, 1, 1, 1], 'mixed': [128, 32, 32, 32, 32]}
    """
    longest = tokens if lengths is None else min(tokens, int(max(lengths)))
    short = max(SHORT_LENGTH, -(-tokens // SHORT_COUNT))
    if lengths is not None:
        short = max(min(short, longest), int(min(lengths)))
    probes = {
        "long": _pieces(tokens, longest),
        "short": _pieces(tokens, short),
        "mixed": [min(tokens // 2, longest)] + _pieces(tokens - min(tokens // 2, longest), min(max(tokens // 8, 1), longest)),
    }
    if lengths is not None:
        rng = np.random.default_rng(seed)
        pool = np.asarray(lengths, dtype=np.int64)
        drawn, total = [], 0
        for value in rng.choice(pool, size=min(len(pool) * 4, 4 * tokens // max(int(pool.min()), 1) + 1)).tolist():
            if total + value > tokens:
                break
            drawn.append(value)
            total += value
        if drawn:
            probes["sampled"] = sorted(drawn, reverse=True)
    return {name: [int(s) for s in probe if s > 0] for name, probe in probes.items() if probe}


def longest_batch(lengths: Optional[Sequence[int]], ceiling: int) -> int:
    """The largest token total worth probing: every length at once (no micro-batch of these
    lengths holds more), at most ``ceiling``; ``ceiling`` for any lengths. O(n).

    >>> longest_batch([100, 300], 1 << 20), longest_batch(None, 4096)
    (400, 4096)
    """
    if lengths is None:
        return int(ceiling)
    return int(min(int(np.asarray(lengths, dtype=np.int64).sum()), ceiling))
