"""Weighted non-negative least squares, exact for a handful of features (pure NumPy).

Both calibrations (peak bytes in :mod:`.memory`, seconds in :mod:`.timing`) fit a linear model
whose every coefficient is a physical size (bytes, seconds) and so cannot be negative. With at
most six features, NNLS is solved exactly by trying every support: the optimum of NNLS is the
least-squares fit on its support, and every support whose fit is non-negative is feasible, so
the best of them is the optimum (2**features ordinary least-squares fits, each features x P).
Chosen over an active-set iteration (SciPy's ``nnls``) to need no SciPy.

``portable=True`` solves each support from the Gram matrix in Python floats, every sum taken
with ``math.fsum`` (correctly rounded): the same inputs give the same bits on every IEEE-754
machine, whatever BLAS or SIMD width NumPy uses. The time model fitted on every rank's pooled
records needs that (ranks that plan with different coefficients could plan differently); it
squares the conditioning, which the four well-separated time features afford and the six
nearly collinear memory features (``max(s)`` beside ``sum(s)``) would not, so the memory fit
keeps NumPy's least squares.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

import numpy as np

__all__ = ["weighted_nnls"]

#: More features than this make the exhaustive search too slow (2**features fits).
MAX_FEATURES = 10


def weighted_nnls(rows: np.ndarray, values: np.ndarray, weights: np.ndarray, *, portable: bool = False) -> np.ndarray:
    """Non-negative ``c`` minimising ``sum((weights * (rows @ c - values))**2)``. Columns are
    scaled to unit maximum before solving, so coefficients of very different sizes (bytes per
    token and bytes per squared token) are found alike. O(2**F * P * F**2) for P rows of F
    features.

    With ``portable``, the same bits on every IEEE-754 machine (module docstring).

    Raises:
        ValueError: shapes that do not match, no row, more than 10 features, or a weight or
            value that is not finite.

    >>> rows = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    >>> weighted_nnls(rows, np.array([3.0, 5.0, 7.0]), np.ones(3)).round(6).tolist()  # 1 + 2 x
    [1.0, 2.0]
    >>> weighted_nnls(rows, np.array([3.0, 2.0, 1.0]), np.ones(3)).round(6).tolist()  # no negative slope
    [2.0, 0.0]
    """
    rows = np.asarray(rows, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0 or values.shape != (rows.shape[0],) or weights.shape != values.shape:
        raise ValueError(f"weighted_nnls needs one row, value and weight per measurement, got rows {rows.shape}, "
                         f"values {values.shape}, weights {weights.shape}")
    if rows.shape[1] > MAX_FEATURES:
        raise ValueError(f"weighted_nnls tries every support: at most {MAX_FEATURES} features, got {rows.shape[1]}")
    if not (np.isfinite(values).all() and np.isfinite(weights).all() and np.isfinite(rows).all()):
        raise ValueError("weighted_nnls needs finite rows, values and weights")
    if portable:
        return _portable_nnls(rows, values, weights)
    weighted = rows * weights[:, None]
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    a = weighted / scale
    target = values * weights
    best, best_error = np.zeros(rows.shape[1]), float(np.sum(target * target))
    for size in range(1, rows.shape[1] + 1):
        for support in itertools.combinations(range(rows.shape[1]), size):
            cols = list(support)
            solution, *_ = np.linalg.lstsq(a[:, cols], target, rcond=None)
            if (solution < 0).any():
                continue
            error = float(np.sum((a[:, cols] @ solution - target) ** 2))
            if error < best_error - 1e-12 * best_error:
                best = np.zeros(rows.shape[1])
                best[cols] = solution
                best_error = error
    return best / scale


def _solve(matrix: list[list[float]], rhs: list[float]) -> Optional[list[float]]:
    """Gaussian elimination with partial pivoting in Python floats; None when singular."""
    n = len(rhs)
    m = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-13 * max(1.0, max(abs(m[r][r]) for r in range(n))):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= factor * m[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (m[r][n] - math.fsum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
    return out


def _portable_nnls(rows: np.ndarray, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`weighted_nnls` in Python floats from the Gram matrix (module docstring)."""
    p, f = rows.shape
    w = [float(x) for x in weights]
    a = [[float(rows[i, j]) * w[i] for j in range(f)] for i in range(p)]
    scale = [max(abs(a[i][j]) for i in range(p)) or 1.0 for j in range(f)]
    a = [[a[i][j] / scale[j] for j in range(f)] for i in range(p)]
    y = [float(values[i]) * w[i] for i in range(p)]
    gram = [[math.fsum(a[i][j] * a[i][k] for i in range(p)) for k in range(f)] for j in range(f)]
    moment = [math.fsum(a[i][j] * y[i] for i in range(p)) for j in range(f)]
    energy = math.fsum(v * v for v in y)
    best, best_error = [0.0] * f, energy
    for size in range(1, f + 1):
        for support in itertools.combinations(range(f), size):
            solution = _solve([[gram[j][k] for k in support] for j in support], [moment[j] for j in support])
            if solution is None or any(v < 0 for v in solution):
                continue
            residual = [math.fsum([a[i][j] * v for j, v in zip(support, solution)] + [-y[i]]) for i in range(p)]
            error = math.fsum(r * r for r in residual)
            if error < best_error - 1e-12 * best_error:
                best = [0.0] * f
                for j, v in zip(support, solution):
                    best[j] = v
                best_error = error
    return np.array([best[j] / scale[j] for j in range(f)])
