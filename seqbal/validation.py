"""The one place that checks what seqbal's entry points are given: integers, lengths, int64 sums.

Every planning entry point (the partitioner, :func:`seqbal.plan_micro_batches`,
:func:`seqbal.build_dp_schedule`, :class:`seqbal.CostModel`, ``seqbal plan``) validates its
inputs here, so one fix reaches all of them; a private copy per module is how a NumPy-scalar
fix once reached one entry point and missed the next. The checks are exact: integers are
compared as Python ints (never through a NumPy scalar that could wrap or mix signs), and sums
that NumPy forms later are bounded first with an exact total, because an int64 sum that wraps
around is a silently wrong plan, not an error. Errors are ``ValueError`` with the numbers; a
caller that needs its own error class (``MicroBatchPlanError``) wraps them.
"""

from __future__ import annotations

import numbers
from itertools import chain
from typing import Any, Optional, Sequence, Union

import numpy as np

from ._default_workload import DEFAULT_LINEAR_COEFFICIENT

IntSequence = Union[Sequence[int], np.ndarray]

INT64_MAX = 2**63 - 1
#: Every sum the partitioner forms (part sums, the bound's scaled sums) stays below
#: ``(DUAL_FEASIBLE_ORDERS + 1) * total`` (see :mod:`seqbal.partition.bounds`); a total above
#: this could wrap around in int64.
INT64_SAFE_TOTAL = INT64_MAX // 11

_TOO_LARGE = "seqbal counts tokens in int64, at most 2**63 - 1"


# ---------------------------------------------------------------------------------------------
# Integer arguments
# ---------------------------------------------------------------------------------------------


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer argument: a Python int or a NumPy integer scalar of any
    width and sign; not a bool (``True`` is not a count), a float or a string. O(1).

    >>> is_int(3), is_int(np.uint8(3)), is_int(True), is_int(3.0), is_int("3")
    (True, True, False, False, False)
    """
    if type(value) is int:  # the common case, without the ABC look-up (planning calls this often)
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def int_argument(
    name: str,
    value: Any,
    *,
    minimum: Optional[int] = 1,
    expected: str = "a positive int",
    optional: bool = False,
    maximum: Optional[int] = INT64_MAX,
) -> Optional[int]:
    """``value`` checked and returned as a Python int (``None`` stays None when ``optional``).

    Returning a Python int is the point: later arithmetic on an ``np.uint8`` divisor wraps
    around (``dp_size * np.uint8(200)``) and NumPy integers lack ``int.bit_length``.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed.
        minimum: the smallest value accepted (None: no lower bound).
        expected: how the message describes a valid value (``"a positive int"``).
        optional: whether ``None`` is accepted.
        maximum: the largest value accepted (default int64's largest; None: any size).

    Raises:
        ValueError: not an int (:func:`is_int`), below ``minimum`` (``{name} must be
            {expected}, got {value!r}``), or above ``maximum`` (``{name}={value} is too large``).

    >>> int_argument("dp_size", np.uint16(8)), int_argument("k", None, optional=True)
    (8, None)
    >>> int_argument("max_token_len", 0)
    Traceback (most recent call last):
    ...
    ValueError: max_token_len must be a positive int, got 0
    """
    if value is None and optional:
        return None
    if not is_int(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name}={number} is too large: {_TOO_LARGE}")
    return number


def flag_argument(name: str, value: Any) -> bool:
    """``value`` checked and returned as a bool: ``True``/``False``, a NumPy bool, or a bool
    tensor or array of one element. O(1).

    ``bool()`` alone is no check: it takes ``"no"`` and ``2`` as True and raises RuntimeError
    (deep in a call) on a tensor of several values.

    >>> flag_argument("equal_size", np.True_)
    True
    >>> flag_argument("equal_size", "yes")
    Traceback (most recent call last):
    ...
    ValueError: equal_size must be True or False, got 'yes'
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    dtype, size = getattr(value, "dtype", None), getattr(value, "numel", getattr(value, "size", None))
    size = size() if callable(size) else size
    if dtype is not None and str(dtype) in ("bool", "torch.bool") and size == 1:
        return bool(value)
    shape = getattr(value, "shape", None)
    what = f"a {type(value).__name__} of shape {tuple(shape)}" if shape is not None else f"{value!r:.60}"
    raise ValueError(f"{name} must be True or False, got {what}")


def check_capacity(capacity: Any) -> int:
    """The partitioner's ``capacity`` as a Python int: a positive int within int64. O(1)."""
    if not is_int(capacity):
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    return int_argument("capacity", capacity)


def check_count(value: Any, name: str) -> int:
    """A count argument of the partitioner (``k``, ``target``, ``step``) as a Python int; its
    range is the caller's to check (a count above the items is an answer, not an error). O(1)."""
    return int_argument(name, value, minimum=None, expected="an int", maximum=None)


# ---------------------------------------------------------------------------------------------
# Lengths (and other per-item integers)
# ---------------------------------------------------------------------------------------------


class LengthsError(ValueError):
    """Lengths that cannot be planned on. ``kind`` says why, for callers that map it to their
    own error codes: ``"bad"`` (shape, type, beyond int64), ``"empty"`` or ``"negative"``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (type(self), (str(self), self.kind))


def _is_torch_tensor(value: Any) -> bool:
    """A torch tensor, recognised without importing torch (planning needs only NumPy)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _tensor_values(tensor: Any, name: str) -> np.ndarray:
    dtype = str(tensor.dtype)
    # bool is rejected like a bool list or array is: True is not a length.
    if tensor.is_floating_point() or tensor.is_complex() or dtype == "torch.bool":
        raise LengthsError(f"{name} must hold integers, got a tensor of dtype {tensor.dtype}", "bad")
    if tensor.device.type == "meta":
        raise LengthsError(
            f"{name} is a tensor on the meta device (shape {tuple(tensor.shape)}): it holds no values "
            f"to plan on; pass the lengths of a real batch",
            "bad",
        )
    return tensor.detach().cpu().numpy()  # keeps the dtype: a uint64 tensor stays unsigned


def int_array(
    values: Any,
    name: str = "lengths",
    *,
    samples: bool = False,
    integral_floats: bool = True,
    negative: bool = False,
    empty: Optional[str] = None,
    sums: bool = True,
) -> np.ndarray:
    """``values`` (a sequence of ints, a NumPy array or a 1-D tensor) as a 1-D int64 array.

    Every value must be an integer within int64: a uint64 value above 2**63 - 1 or a Python
    int beyond int64 is *too large* (never wrapped around into "a negative length").

    Args:
        values: the caller's values.
        name: how the message names them (``seq_lens``, ``lengths``, ``tokens``...).
        samples: messages speak of samples and tokens (``sample 3 has a negative length``),
            as the planners' do; else of items of ``name``, as the partitioner's do.
        integral_floats: accept floats that are whole numbers (the partitioner's helpers do;
            the planners reject floats).
        negative: accept negative values (workload sums are checked by the caller).
        empty: the message when an empty input is an error; None accepts it.
        sums: also bound the exact total (:func:`check_int64_sums`).

    Raises:
        LengthsError: (a ``ValueError``) not 1-D, not integers, beyond int64, negative, empty,
            or a total that could overflow int64; the message names the first offending index.

    Complexity: O(n).

    >>> int_array([3, 1]).tolist()
    [3, 1]
    >>> int_array(np.array([5, 2**63 + 5], dtype=np.uint64), "seq_lens", samples=True)
    Traceback (most recent call last):
    ...
    seqbal.validation.LengthsError: sample 1 has 9223372036854775813 tokens, more than seqbal counts in int64 (2**63 - 1)
    """
    array = _tensor_values(values, name) if _is_torch_tensor(values) else np.asarray(values)
    if isinstance(values, (list, tuple)) and array.dtype.kind in "iuf":
        kinds = set(map(type, values))  # NumPy reads [True, 3] as [1, 3]: a bool among ints is no length
        if bool in kinds or np.bool_ in kinds:
            index = next(i for i, v in enumerate(values) if isinstance(v, (bool, np.bool_)))
            raise LengthsError(f"{name} must hold integers, got {values[index]!r} (a bool) at item {index}", "bad")
    if array.ndim != 1:
        what = f"a {type(values).__name__}" if array.ndim == 0 else f"shape {tuple(array.shape)}"
        raise LengthsError(f"{name} must be one-dimensional (a sequence, array or tensor of ints), got {what}", "bad")
    if array.size == 0:
        if empty is not None:
            raise LengthsError(empty, "empty")
        return np.zeros(0, dtype=np.int64)

    def too_large(index: int, value: Any) -> LengthsError:
        if samples:
            return LengthsError(f"sample {index} has {value} tokens, more than seqbal counts in int64 (2**63 - 1)", "bad")
        return LengthsError(f"{name}: item {index} is {value}, beyond int64 (at most 2**63 - 1)", "bad")

    kind = array.dtype.kind
    if kind == "f" and not isinstance(values, np.ndarray):
        # NumPy makes float64 of a list that mixes ints with ints beyond int64 ([3, 2**63 + 5]):
        # the ints are taken as they are, not rounded
        exact = np.asarray(values, dtype=object)
        if exact.ndim == 1 and all(is_int(v) for v in exact.tolist()):
            array, kind = exact, "O"
    if kind == "O":  # Python ints beyond int64 (or objects that are not ints)
        items = array.tolist()
        if not all(is_int(v) for v in items):
            raise LengthsError(f"{name} must hold integers, got dtype {array.dtype}", "bad")
        for index, value in enumerate(items):
            if not -INT64_MAX <= value <= INT64_MAX:
                if value < 0 and not negative:
                    break  # reported as negative below
                raise too_large(index, value)
        array = np.array([max(min(v, INT64_MAX), -INT64_MAX) for v in items], dtype=np.int64)
    elif kind == "f" and integral_floats and np.all(np.isfinite(array)) and np.all(np.mod(array, 1) == 0):
        big = np.abs(array) >= float(2**63)
        if big.any():
            index = int(np.argmax(big))
            raise too_large(index, int(array[index]))
        array = array.astype(np.int64)
    elif kind not in "iu":
        raise LengthsError(f"{name} must hold integers, got dtype {array.dtype}", "bad")
    elif kind == "u" and int(array.max()) > INT64_MAX:
        index = int(np.argmax(array > INT64_MAX))
        raise too_large(index, int(array[index]))
    array = array.astype(np.int64, copy=False)
    if not negative and (array < 0).any():
        index = int(np.argmax(array < 0))
        if samples:
            raise LengthsError(f"sample {index} has a negative length ({int(array[index])} tokens)", "negative")
        raise LengthsError(f"{name} must be non-negative, but item {index} is negative ({int(array[index])})", "negative")
    if sums:
        check_int64_sums(array, name=name)
    return array


def as_int_array(values: IntSequence, name: str = "lengths", *, negative: bool = True) -> np.ndarray:
    """The partitioner's input conversion: :func:`int_array` with its messages (items of
    ``name``), integral floats accepted, and negative values left to the caller's own check
    unless ``negative=False``."""
    return int_array(values, name, negative=negative)


# ---------------------------------------------------------------------------------------------
# Exact sums
# ---------------------------------------------------------------------------------------------


def exact_total(values: np.ndarray) -> int:
    """Exact sum of the positive entries of an int64 array, as a Python int. O(n)."""
    positive = values[values > 0]
    if positive.size == 0:
        return 0
    if int(positive.max()) <= INT64_MAX // len(positive):
        return int(positive.sum())  # cannot wrap
    return sum(positive.tolist())


def check_total(total: float, name: str) -> None:
    if total > INT64_SAFE_TOTAL:
        raise ValueError(
            f"the {name} sum to {int(total)}, above {INT64_SAFE_TOTAL} (int64 max / 11): sums of "
            f"micro-batches and of the packing bound could overflow int64; use smaller units"
        )


def check_int64_sums(
    tokens: IntSequence, workloads: Union[IntSequence, str, None] = None, *, name: str = "lengths"
) -> None:
    """Raise ``ValueError`` when a sum the partitioner or the planner forms could overflow int64.

    The one guard used by every partitioner entry point (through its input conversion),
    :func:`seqbal.plan_micro_batches` / :func:`seqbal.plan_data_parallel` and
    :func:`seqbal.build_dp_schedule`. It checks the exact (Python int) total of ``tokens``
    against :data:`INT64_SAFE_TOTAL`; with ``workloads`` also their total, where
    ``workloads="default"`` means the default model ``24576 s + s**2`` computed exactly from
    ``tokens`` (so the check runs before the model itself could wrap around).

    Complexity: O(n).

    >>> check_int64_sums([2**61] * 4)
    Traceback (most recent call last):
    ...
    ValueError: the lengths sum to 9223372036854775808, above 838488366986797800 (int64 max / 11): sums of micro-batches and of the packing bound could overflow int64; use smaller units
    """
    array = tokens if isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 and tokens.ndim == 1 else (
        int_array(tokens, name, negative=True, sums=False))
    check_total(exact_total(array), name)
    if isinstance(workloads, str):
        if workloads != "default":
            raise ValueError(f"workloads must be values or 'default', got {workloads!r}")
        check_total(_default_workload_total(array), "workloads")
    elif workloads is not None:
        check_total(exact_total(int_array(workloads, "workloads", negative=True, sums=False)), "workloads")


def _default_workload_total(tokens: np.ndarray) -> int:
    """Exact total of the default model ``24576 s + s**2`` over the positive ``tokens``. O(n)."""
    positive = tokens[tokens > 0]
    if positive.size and int(positive.max()) <= 2**31:  # each workload fits in int64
        return exact_total(DEFAULT_LINEAR_COEFFICIENT * positive + positive * positive)
    return sum(DEFAULT_LINEAR_COEFFICIENT * v + v * v for v in positive.tolist())  # Python ints: no wrap


def check_items_fit(sizes: np.ndarray, capacity: Any) -> int:
    """The packers' check: ``capacity`` valid (returned as an int), no item negative or above it."""
    capacity = check_capacity(capacity)
    if sizes.size and (sizes < 0).any():
        index = int(np.argmax(sizes < 0))
        raise ValueError(f"length of item {index} is negative ({int(sizes[index])})")
    if sizes.size and sizes.max() > capacity:
        index = int(np.argmax(sizes > capacity))
        raise ValueError(f"item {index} has {int(sizes[index])} tokens and exceeds capacity {capacity}")
    return capacity


def check_is_partition(bins: Sequence[Sequence[Any]], n: int) -> None:
    """ValueError unless ``bins`` hold every index ``0..n-1`` exactly once. O(n).

    One NumPy pass when they do; the item-by-item walk below only runs to name what is wrong.
    """
    flat = np.array(list(chain.from_iterable(bins)))
    if flat.size == n and (n == 0 or flat.dtype.kind in "iu" and np.array_equal(np.sort(flat), np.arange(n))):
        return
    seen = np.zeros(n, dtype=bool)
    for position, items in enumerate(bins):
        for item in items:
            if not isinstance(item, (int, np.integer)) or isinstance(item, bool) or not 0 <= item < n:
                raise ValueError(f"bin {position} holds {item!r}, not an index into {n} items")
            if seen[item]:
                raise ValueError(f"item {item} appears twice in bins (again in bin {position})")
            seen[item] = True
    if not seen.all():
        raise ValueError(f"bins hold {int(seen.sum())} of the {n} items; item {int(np.argmin(seen))} is missing")


# ---------------------------------------------------------------------------------------------
# Group ids
# ---------------------------------------------------------------------------------------------


def _id_value(value: Any) -> Any:
    """One group id as a value: a 0-d tensor or array, or a NumPy scalar, becomes its Python
    scalar; a tensor or array of several values the tuple of them. Anything else is itself."""
    if _is_torch_tensor(value) or isinstance(value, (np.ndarray, np.generic)):
        if _is_torch_tensor(value):
            value = value.detach().cpu()
        items = value.tolist()
        return tuple(items) if isinstance(items, list) else items
    return value


def group_keys(group_ids: Any, name: str = "group_ids") -> list[Any]:
    """Group ids (a sequence, a NumPy array or a 1-D tensor, one id per sample) as a list of
    hashable values, so that equal ids are one group however they were given. O(n).

    A 0-d tensor hashes by identity (``torch.tensor(1)`` and another ``torch.tensor(1)`` are
    different dict keys), so ids given as a tensor, an array or a list of 0-d tensors are read
    as their values: every entry point that takes group ids (:class:`seqbal.StepPlanner`,
    :func:`seqbal.build_dp_schedule`, the samplers) groups by what this returns.

    Raises:
        ValueError: not a sequence (a 0-d tensor or array, a scalar, a set), or an id that is
            not hashable (naming its position).

    >>> import numpy as np
    >>> group_keys(np.array([7, 7, 3])), group_keys([np.int64(1), 1, "a"])
    ([7, 7, 3], [1, 1, 'a'])
    """
    if _is_torch_tensor(group_ids) or isinstance(group_ids, np.ndarray):
        shape = tuple(group_ids.shape)
        if len(shape) != 1:
            raise ValueError(
                f"{name} must be one id per sample (a 1-D {type(group_ids).__name__}), got shape {shape}")
        return group_ids.detach().cpu().tolist() if _is_torch_tensor(group_ids) else group_ids.tolist()
    if isinstance(group_ids, (str, bytes, set, frozenset, dict)) or not hasattr(group_ids, "__len__") \
            or not hasattr(group_ids, "__getitem__"):
        raise ValueError(
            f"{name} must be a sequence (list, tuple, array or tensor) of one hashable id per sample, got "
            f"{type(group_ids).__name__}"
        )
    keys = [_id_value(v) for v in group_ids]
    for position, key in enumerate(keys):
        try:
            hash(key)
        except TypeError:
            raise ValueError(
                f"{name}[{position}] is {key!r}, not hashable ({type(key).__name__}); pass ints or strings") from None
    return keys
