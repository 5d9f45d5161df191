"""Parts as index lists: their sums, their labels, and the integer rounding of counts.

A partition is a list of parts, each a list of item indices. The helpers here turn between a
label per item and index lists, and sum values over parts in one NumPy pass (not a Python
loop per part), because every algorithm of the partitioner asks for part sums many times.
``ceildiv`` and ``roundup_divisible`` are exact integer arithmetic (no float rounding), so
bounds and counts are the same for any size of input.
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np

from ..validation import IntSequence, as_int_array, int_argument

def ceildiv(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for integers, exact for any size (no float rounding).

    Python ints and NumPy integer scalars of any width and sign are taken as their values (the
    result is a Python int, so an ``np.uint8`` divisor cannot wrap around). O(1).

    Raises:
        ValueError: ``a`` or ``b`` not an int (bools and floats included), or ``b == 0``.

    >>> ceildiv(7, 3), ceildiv(6, 3), ceildiv(0, 5), ceildiv(7, np.uint8(3))
    (3, 2, 0, 3)
    """
    a = int_argument("a", a, minimum=None, expected="an int", maximum=None)
    b = int_argument("b", b, minimum=None, expected="an int", maximum=None)
    if b == 0:
        raise ValueError(f"ceildiv({a}, 0): the divisor must not be 0")
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """Smallest multiple of ``b`` that is ``>= a`` (``b`` positive), as a Python int.

    O(1).

    Raises:
        ValueError: ``a`` or ``b`` not an int, or ``b < 1``.

    >>> roundup_divisible(7, 4), roundup_divisible(8, 4)
    (8, 8)
    """
    b = int_argument("b", b, minimum=1, expected="a positive int", maximum=None)
    return ceildiv(a, b) * b


def partition_sums(values: IntSequence, partitions: Sequence[Sequence[int]]) -> np.ndarray:
    """Sum of ``values`` over each partition, as an int64 array. O(n).

    >>> partition_sums([5, 1, 2], [[0], [1, 2]]).tolist()
    [5, 3]
    """
    return _part_sums(as_int_array(values, "values"), partitions)


def _part_sums(values: np.ndarray, parts: Sequence[Sequence[int]]) -> np.ndarray:
    """Exact int64 sum of ``values`` over each part (parts may be empty), in one NumPy pass. O(n)."""
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    if not len(parts):
        return np.zeros(0, dtype=np.int64)
    flat = np.fromiter(chain.from_iterable(parts), dtype=np.int64, count=int(sizes.sum()))
    starts = np.cumsum(sizes) - sizes
    sums = np.add.reduceat(np.append(values[flat], 0), starts)  # the 0 makes a final empty part valid
    return np.where(sizes > 0, sums, 0)  # reduceat yields the next value, not 0, for an empty part


def _groups_from_assignment(assignment: np.ndarray, k: int) -> list[list[int]]:
    """Index lists per part from a part label per item; indices ascending. O(n log n)."""
    order = np.argsort(assignment, kind="stable")
    bounds = np.searchsorted(assignment[order], np.arange(k + 1))
    order_list = order.tolist()
    return [order_list[bounds[i]:bounds[i + 1]] for i in range(k)]


def _assignment_from_groups(groups: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """The part label of every item, from index lists that partition ``range(n)`` (the inverse
    of :func:`_groups_from_assignment`). O(n)."""
    labels = np.empty(n, dtype=np.int64)
    labels[np.fromiter(chain.from_iterable(groups), dtype=np.int64, count=n)] = np.repeat(
        np.arange(len(groups)), [len(g) for g in groups])
    return labels


def _descending(values: np.ndarray) -> list[int]:
    """Item indices by descending value, ascending index among equal values. O(n log n)."""
    return np.lexsort((np.arange(len(values)), -values)).tolist()
