"""Reading a user's length file for ``seqbal plan``, and the checks that need the file's lines.

Every length is checked where it is read, so an error can name the file and line: integers
below 2**63 only (a 40-digit length, a uint64 ``.npy`` value or ``1e300`` is "too large", not a
wrapped "negative length"), a UTF-8 byte-order mark accepted, JSON nested too deeply reported
as invalid JSON. Lengths are kept with their places in the file (line numbers, or element/row
indices), because after the split over ranks and a shuffle only those still mean something to
the user. Pure Python and NumPy (pyarrow only for ``.parquet``); nothing here knows about ranks.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from ..cost import CostModel
from ..validation import INT64_MAX

__all__ = [
    "DEFAULT_SAMPLE", "MAX_INT64", "InputError", "Lengths", "read_lengths", "check_workload_range", "check_groups_fit",
]

#: The length sample used when no file is given (see ``seqbal/data/README.md`` for its source).
DEFAULT_SAMPLE = Path(__file__).resolve().parent.parent / "data" / "qwen25math_cot_rollouts.txt"
MAX_INT64 = INT64_MAX  # the one int64 bound of every entry point (seqbal.validation)


class InputError(Exception):
    """Input that cannot be read or used; the message names the file (and line when there is one)."""


# ---------------------------------------------------------------------------------------------
# Reading lengths
# ---------------------------------------------------------------------------------------------


@dataclass
class Lengths:
    """Lengths read from the user's input, with where each came from.

    Attributes:
        values: int64 lengths, in file order.
        places: for each length, its line number in a text or ``.jsonl`` file (1-based), or its
            element/row index in a ``.npy``/``.parquet`` file (0-based).
        unit: ``"line"``, ``"element"`` or ``"row"``: what ``places`` counts.
        name: how the input is shown (file name, ``<stdin>``, or the shipped sample).
    """

    values: np.ndarray
    places: np.ndarray
    unit: str
    name: str

    def place(self, index: int) -> str:
        return f"{self.unit} {int(self.places[index])}"

    def span(self, first: int, last: int) -> str:
        """``line 7`` or ``lines 7-14``: where samples ``first..last`` (inclusive) are."""
        a, b = int(self.places[first]), int(self.places[last])
        return f"{self.unit} {a}" if a == b else f"{self.unit}s {a}-{b}"


def _too_large(value: Any, where: str) -> InputError:
    return InputError(f"{where}: length {value} is too large (at most 2**63 - 1 = {MAX_INT64} tokens)")


def _length_of(value: Any, where: str) -> int:
    """An int, an integral float, or the length of a list (token ids), checked; InputError otherwise."""
    if isinstance(value, bool) or value is None:
        raise InputError(f"{where}: expected an integer length or a list of token ids, got {value!r}")
    if isinstance(value, int):
        length = value
    elif isinstance(value, float):
        if not value.is_integer():  # also NaN and infinities
            raise InputError(f"{where}: expected an integer length, got {value!r}")
        if abs(value) > MAX_INT64:
            raise _too_large(repr(value), where)
        length = int(value)
    elif isinstance(value, (list, tuple)):
        length = len(value)
    else:
        raise InputError(f"{where}: expected an integer length or a list of token ids, got {value!r:.60}")
    if length < 0:
        raise InputError(f"{where}: negative length {length}")
    if length > MAX_INT64:
        raise _too_large(length, where)
    return length


def _record_length(record: Any, fields: Optional[list[str]], where: str) -> int:
    """The length one JSON record (or parquet row) stands for: the record itself, or the sum of
    ``fields`` of an object (``prompt_len+response_len``)."""
    if fields is None:
        if isinstance(record, dict):
            raise InputError(f"{where}: a JSON object; pass --field NAME (or NAME+NAME) to say which keys hold the length")
        return _length_of(record, where)
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with {'+'.join(fields)}, got {record!r:.60}")
    total = 0
    for name in fields:
        if name not in record:
            raise InputError(f"{where}: no field {name!r} (keys: {sorted(record)[:10]})")
        total += _length_of(record[name], f"{where}: field {name!r}")
    if total > MAX_INT64:
        raise _too_large(total, where)
    return total


def _text_lines(path: Optional[Path], stdin: Optional[io.TextIOBase]) -> Iterable[str]:
    """Lines of a file or of standard input, UTF-8 with an optional byte-order mark."""
    if path is not None:
        with path.open("r", encoding="utf-8-sig") as handle:
            yield from handle
        return
    assert stdin is not None
    buffer = getattr(stdin, "buffer", None)
    stream = io.TextIOWrapper(buffer, encoding="utf-8-sig") if buffer is not None else stdin
    for number, line in enumerate(stream):
        yield line.lstrip("\ufeff") if number == 0 else line


def _integral_float(text: str, where: str) -> float:
    """A text line that is not an int: a float literal is read as every format reads floats
    (``5.0`` and ``4e3`` are lengths, as in ``.npy``, ``.jsonl`` and ``.parquet``; ``5.5``,
    ``nan`` and ``inf`` are not, and :func:`_length_of` says so); anything else is an error."""
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{where}: expected one integer per line, got {text[:40]!r}") from None


def _read_text(lines: Iterable[str], name: str) -> tuple[list[int], list[int]]:
    values, places = [], []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{name}:{number}"
        try:
            value = int(text)
        except ValueError:
            value = _integral_float(text, where)
        values.append(_length_of(value, where))
        places.append(number)
    return values, places


def _read_jsonl(lines: Iterable[str], name: str, fields: Optional[list[str]]) -> tuple[list[int], list[int]]:
    values, places = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            record = json.loads(line)
        except RecursionError:
            raise InputError(f"{where}: not valid JSON (nested too deeply)") from None
        except ValueError as error:  # JSONDecodeError, or an integer with too many digits
            raise InputError(f"{where}: not valid JSON ({getattr(error, 'msg', error)})") from None
        values.append(_record_length(record, fields, where))
        places.append(number)
    return values, places


def _read_npy(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as error:  # noqa: BLE001 - any failure to parse is an input error
        raise InputError(f"{path}: cannot read as a .npy array ({error})") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1:
        shape = getattr(array, "shape", None)
        raise InputError(f"{path}: expected a 1-D array of lengths, got shape {shape}")
    kind = array.dtype.kind
    if kind not in "iuf":
        raise InputError(f"{path}: expected integer lengths, got dtype {array.dtype}")
    if array.size:
        if kind == "f":
            bad = ~np.isfinite(array) | (np.mod(np.nan_to_num(array), 1) != 0)
            if bad.any():
                index = int(np.argmax(bad))
                raise InputError(f"{path}: element {index}: expected an integer length, got {array[index]!r}")
        if kind != "u" and (array < 0).any():
            index = int(np.argmax(array < 0))
            raise InputError(f"{path}: element {index}: negative length {array[index]}")
        too_large = array > MAX_INT64 if kind != "i" else np.zeros(array.shape, dtype=bool)
        if kind == "f":  # float64(2**63 - 1) rounds up to 2**63: compare against that exactly
            too_large = array >= float(2**63)
        if too_large.any():
            index = int(np.argmax(too_large))
            raise _too_large(array[index], f"{path}: element {index}")
    values = array.astype(np.int64)
    return values, np.arange(len(values), dtype=np.int64)


def _read_parquet(path: Path, columns: Optional[list[str]]) -> tuple[list[int], list[int]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(
            f"{path}: reading .parquet needs pyarrow, which is not installed; "
            f"pip install pyarrow (or convert the lengths to a text file, one per line)"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"{path}: cannot read as parquet ({error})") from None
    if columns is None:
        if table.num_columns != 1:
            raise InputError(f"{path}: {table.num_columns} columns {table.column_names}; pass --column NAME (or NAME+NAME)")
        columns = [table.column_names[0]]
    for column in columns:
        if column not in table.column_names:
            raise InputError(f"{path}: no column {column!r} (columns: {table.column_names})")
    data = {column: table.column(column).to_pylist() for column in columns}
    values = [_record_length({c: data[c][row] for c in columns}, columns, f"{path}: row {row}") for row in range(table.num_rows)]
    return values, list(range(table.num_rows))


def _names(spec: Optional[str], option: str) -> Optional[list[str]]:
    """``a+b`` -> ``["a", "b"]``; the lengths of a record are the sum of these fields."""
    if spec is None:
        return None
    names = [name.strip() for name in spec.split("+")]
    if not all(names):
        raise InputError(f"{option} {spec!r}: expected NAME or NAME+NAME+..., with no empty name")
    return names


def read_lengths(
    path: Optional[str] = None,
    *,
    field: Optional[str] = None,
    column: Optional[str] = None,
    stdin: Optional[io.TextIOBase] = None,
) -> Lengths:
    """Read sequence lengths from ``path`` (format by extension), ``-`` (standard input), or the
    shipped sample if None.

    Text: one integer per line (blank lines and ``#`` comments skipped, a UTF-8 byte-order mark
    accepted).
    In every format a float is accepted when it is integral (``5.0``, ``4e3``) and rejected
    otherwise (``5.5``, NaN, infinities), naming its line, element or row. ``.npy``: a 1-D integer array. ``.jsonl``: one record per line, an integer, a list
    (its length), or an object whose ``field`` holds one of those; ``field`` may be a sum,
    ``prompt_len+response_len``. ``.parquet``: the column ``column`` (ints or lists, sums
    allowed), pyarrow needed. Standard input is read as text, or as ``.jsonl`` with ``field``.
    Every length must be a non-negative integer below 2**63, and so must their total.

    Raises:
        InputError: the file is missing, unreadable, malformed, empty, or ``field``/``column``
            do not apply to its format; the message names the file and, for line-based
            formats, the line.
    """
    fields, columns = _names(field, "--field"), _names(column, "--column")
    from_stdin = path == "-"
    file = None if from_stdin else (DEFAULT_SAMPLE if path is None else Path(path))
    name = "<stdin>" if file is None else str(file)
    if file is not None:
        if not file.exists():
            raise InputError(f"{file}: no such file")
        if not file.is_file():
            raise InputError(f"{file}: not a file")
    suffix = "" if file is None else file.suffix.lower()
    kind = {".npy": "npy", ".jsonl": "jsonl", ".parquet": "parquet"}.get(suffix, "text")
    if from_stdin and fields is not None:
        kind = "jsonl"
    if fields is not None and kind != "jsonl":
        raise InputError(
            f"{name}: --field applies to .jsonl input (one JSON object per line), but this input is read as "
            f"{'a .' + kind + ' file' if kind != 'text' else 'plain text, one integer per line'}"
            f"{'; use --column for parquet' if kind == 'parquet' else '; drop --field, or give a .jsonl file'}"
        )
    if columns is not None and kind != "parquet":
        raise InputError(f"{name}: --column applies to .parquet input only; use --field for .jsonl")
    try:
        if kind == "npy":
            values, places = _read_npy(file)
            unit = "element"
        elif kind == "parquet":
            values, places = _read_parquet(file, columns)
            unit = "row"
        else:
            lines = _text_lines(file, stdin if stdin is not None else sys.stdin)
            values, places = _read_jsonl(lines, name, fields) if kind == "jsonl" else _read_text(lines, name)
            unit = "line"
    except UnicodeDecodeError:
        raise InputError(f"{name}: not a UTF-8 text file (use .npy, .jsonl or .parquet for other formats)") from None
    except OSError as error:
        raise InputError(f"{name}: cannot read ({error.strerror or error})") from None
    array = np.asarray(values, dtype=np.int64)
    if array.size == 0:
        raise InputError(f"{name}: no lengths found")
    # Lengths below 2**63 can still add up past it; the planners count in int64.
    if int(array.max()) > MAX_INT64 // len(array) and sum(array.tolist()) > MAX_INT64:
        raise InputError(f"{name}: the {len(array)} lengths add up to {sum(array.tolist())} tokens, more than 2**63 - 1")
    if name == str(DEFAULT_SAMPLE):
        name = f"{DEFAULT_SAMPLE.name} (shipped sample)"
    return Lengths(array, np.asarray(places, dtype=np.int64), unit, name)


def check_workload_range(lengths: Lengths) -> None:
    """The workload model ``24576 s + s**2`` of every sample, and their total, fit in int64.

    The planners balance workloads in int64; past that they would wrap around silently (a
    balance on garbage) or report a misleading "negative workload". The bound used,
    ``(24576 + longest) * total tokens``, is above the true total, so this never rejects input
    that fits; it only rejects lengths far beyond any model's context (billions of tokens).

    Raises:
        InputError: the bound exceeds 2**63 - 1.
    """
    longest = int(lengths.values.max())
    total = sum(lengths.values.tolist())
    if (24576 + longest) * total > MAX_INT64:
        index = int(np.argmax(lengths.values))
        raise InputError(
            f"{lengths.name}: lengths this large overflow the workload model (24576 s + s**2 per sample, counted "
            f"in 64 bits): the longest is {longest} tokens ({lengths.place(index)}) and the total {total}"
        )


def check_groups_fit(lengths: Lengths, max_token_len: int, group_size: int, cost_model: Optional[CostModel] = None) -> None:
    """Every sample (or forced group of ``group_size`` consecutive samples) fits under the cap,
    costed by ``cost_model`` (effective tokens by default).

    Checked on the whole input before it is split over ranks, so the message can name the places
    in the user's file, not rank-local or post-shuffle indices.

    Raises:
        InputError: ``group_size`` does not divide the number of samples, or some groups are over
            the cap (how many, the largest with its lines, the first few others).
    """
    values = lengths.values
    n, g = len(values), group_size
    if n % g:
        raise InputError(f"--group-size {g} does not divide the number of samples {n} (remainder {n % g})")
    cost_model = cost_model or CostModel()
    tokens = cost_model.group_costs(values, g)
    over = np.flatnonzero(tokens > max_token_len)
    if not over.size:
        return
    what = "sample(s)" if g == 1 else f"group(s) of {g} consecutive samples"
    largest = int(over[np.argmax(tokens[over])])
    listed = ", ".join(lengths.span(i * g, i * g + g - 1) for i in over[:5].tolist())
    more = f" and {over.size - 5} more" if over.size > 5 else ""
    advice = f"raise --max-token-len to at least {int(tokens[largest])}" + (" or lower --group-size" if g > 1 else "")
    size = f"has {int(tokens[largest])} tokens" if cost_model.is_default else (
        f"costs {int(tokens[largest])} under the {cost_model}")
    raise InputError(
        f"{over.size} {what} over --max-token-len {max_token_len}; the largest {size} "
        f"({lengths.span(largest * g, largest * g + g - 1)}); over: {listed}{more}; {advice}"
    )
