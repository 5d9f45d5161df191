"""``seqbal plan``: see what seqbal will do with your lengths before you launch a run.

The command reads a length distribution (a text file, ``.npy``, ``.jsonl`` or ``.parquet``, or
the real rollout sample shipped in ``seqbal/data``), splits it over simulated data-parallel
ranks the way a trainer does (contiguous chunks, optionally shuffled first), and applies the
same decision the ranks would make together: each rank finds its smallest feasible count, the
ranks take the largest, and every rank partitions at that count. It then prints the per-rank
figures next to those of the older KK loop, so the gain is visible on the user's own data.

The CLI never shows a traceback: impossible settings print the library's own explanation,
unreadable input names the file and line, and both exit with code 2 (argparse's usage code).
The simulation is the public :func:`~seqbal.plan_data_parallel`: the library's own agreement
protocol with the all-reduces replaced by a max/min over the simulated ranks, so what it shows is
exactly what each rank would get; no collective is involved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ._kk_loop import kk_loop_plans
from .metrics import micro_batch_summary
from .plan import MicroBatchPlanError, plan_data_parallel

__all__ = ["main", "read_lengths", "simulate_ranks", "DEFAULT_SAMPLE"]

#: The length sample used when no file is given (see ``seqbal/data/README.md`` for its source).
DEFAULT_SAMPLE = Path(__file__).resolve().parent / "data" / "qwen25math_cot_rollouts.txt"
DEFAULT_MAX_TOKEN_LEN = 4096
EXIT_USAGE = 2


class InputError(Exception):
    """Input that cannot be read; the message names the file (and line when there is one)."""


# ---------------------------------------------------------------------------------------------
# Reading lengths
# ---------------------------------------------------------------------------------------------


def _length_of(value: Any, where: str) -> int:
    """An int, or the length of a list (token ids), from one record; InputError otherwise."""
    if isinstance(value, bool):
        raise InputError(f"{where}: expected an integer length or a list of token ids, got {value!r}")
    if isinstance(value, int):
        length = value
    elif isinstance(value, float) and value.is_integer():
        length = int(value)
    elif isinstance(value, (list, tuple)) or (hasattr(value, "__len__") and not isinstance(value, (str, bytes, dict))):
        length = len(value)
    else:
        raise InputError(f"{where}: expected an integer length or a list of token ids, got {value!r}")
    if length < 0:
        raise InputError(f"{where}: negative length {length}")
    return length


def _read_text(path: Path) -> np.ndarray:
    lengths = []
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                value = int(text)
            except ValueError:
                raise InputError(f"{path}:{number}: expected one integer per line, got {text[:40]!r}") from None
            if value < 0:
                raise InputError(f"{path}:{number}: negative length {value}")
            lengths.append(value)
    return np.asarray(lengths, dtype=np.int64)


def _read_jsonl(path: Path, field: Optional[str]) -> np.ndarray:
    lengths = []
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{where}: not valid JSON ({error.msg})") from None
            if isinstance(record, dict):
                if field is None:
                    raise InputError(f"{where}: a JSON object; pass --field NAME to say which key holds the length")
                if field not in record:
                    raise InputError(f"{where}: no field {field!r} (keys: {sorted(record)[:10]})")
                record = record[field]
            lengths.append(_length_of(record, where))
    return np.asarray(lengths, dtype=np.int64)


def _read_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as error:  # noqa: BLE001 - any failure to parse is an input error
        raise InputError(f"{path}: cannot read as a .npy array ({error})") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1:
        shape = getattr(array, "shape", None)
        raise InputError(f"{path}: expected a 1-D array of lengths, got shape {shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.floating) and np.all(np.mod(array, 1) == 0):
            array = array.astype(np.int64)
        else:
            raise InputError(f"{path}: expected integer lengths, got dtype {array.dtype}")
    if array.size and (array < 0).any():
        index = int(np.argmax(array < 0))
        raise InputError(f"{path}: element {index} is a negative length ({int(array[index])})")
    return array.astype(np.int64)


def _read_parquet(path: Path, column: Optional[str]) -> np.ndarray:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(
            f"{path}: reading .parquet needs pyarrow, which is not installed; "
            f"pip install 'seqbal[parquet]' (or convert the lengths to a text file, one per line)"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as error:  # noqa: BLE001
        raise InputError(f"{path}: cannot read as parquet ({error})") from None
    if column is None:
        if table.num_columns != 1:
            raise InputError(f"{path}: {table.num_columns} columns {table.column_names}; pass --column NAME")
        column = table.column_names[0]
    if column not in table.column_names:
        raise InputError(f"{path}: no column {column!r} (columns: {table.column_names})")
    values = table.column(column).to_pylist()
    return np.asarray([_length_of(v, f"{path}: row {i}") for i, v in enumerate(values)], dtype=np.int64)


def read_lengths(path: Optional[str] = None, *, field: Optional[str] = None, column: Optional[str] = None) -> np.ndarray:
    """Read sequence lengths from ``path`` (by extension), or the shipped sample if None.

    Text: one integer per line (blank lines and ``#`` comments skipped). ``.npy``: a 1-D integer
    array. ``.jsonl``: one record per line, an integer, a list (its length), or an object whose
    ``field`` holds one of those. ``.parquet``: the column ``column`` (ints or lists), pyarrow needed.

    Raises:
        InputError: the file is missing, unreadable, malformed or empty; the message names the
            file and, for line-based formats, the line.
    """
    file = DEFAULT_SAMPLE if path is None else Path(path)
    if not file.exists():
        raise InputError(f"{file}: no such file")
    if not file.is_file():
        raise InputError(f"{file}: not a file")
    suffix = file.suffix.lower()
    try:
        if suffix == ".npy":
            lengths = _read_npy(file)
        elif suffix == ".jsonl":
            lengths = _read_jsonl(file, field)
        elif suffix == ".parquet":
            lengths = _read_parquet(file, column)
        else:
            lengths = _read_text(file)
    except UnicodeDecodeError:
        raise InputError(f"{file}: not a text file (use .npy, .jsonl or .parquet for other formats)") from None
    except OSError as error:
        raise InputError(f"{file}: cannot read ({error.strerror or error})") from None
    if lengths.size == 0:
        raise InputError(f"{file}: no lengths found")
    return lengths


# ---------------------------------------------------------------------------------------------
# Simulating data-parallel ranks
# ---------------------------------------------------------------------------------------------


@dataclass
class RankSplit:
    """Lengths of each simulated rank, cut from the (optionally shuffled) input."""

    lengths: list[np.ndarray]


def split_over_ranks(lengths: np.ndarray, dp: int, group_size: int = 1, seed: Optional[int] = None) -> RankSplit:
    """Cut ``lengths`` into ``dp`` contiguous chunks of whole forced groups, as a trainer does.

    With ``seed``, groups are shuffled first (a seeded sampler). Chunk sizes differ by at most
    one group (``numpy.array_split`` on groups), so no sample is dropped.

    Raises:
        InputError: ``group_size`` does not divide the number of samples, or fewer groups than ranks.
    """
    n = len(lengths)
    if n % group_size:
        raise InputError(f"--group-size {group_size} does not divide the number of samples {n}")
    groups = lengths.reshape(-1, group_size)
    if seed is not None:
        groups = groups[np.random.default_rng(seed).permutation(len(groups))]
    if len(groups) < dp:
        raise InputError(f"cannot split {len(groups)} group(s) of {group_size} sample(s) over --dp {dp} ranks")
    return RankSplit([chunk.reshape(-1) for chunk in np.array_split(groups, dp)])


def simulate_ranks(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
) -> list[list[list[int]]]:
    """What synced ranks decide: :func:`~seqbal.plan_data_parallel`, the library's own protocol
    with the all-reduces replaced by a max/min over the simulated ranks.

    Raises:
        MicroBatchPlanError: the library's own error, prefixed with the rank when ``dp > 1``.
    """
    return plan_data_parallel(
        list(rank_lengths),
        max_token_len,
        num_batches_divided_by=num_batches_divided_by,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=False,
        force_group_size=force_group_size,
    )


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def _rank_rows(rank_lengths: Sequence[np.ndarray], plans: Sequence[list[list[int]]], cap: int) -> list[dict[str, Any]]:
    rows = []
    for rank, (lengths, parts) in enumerate(zip(rank_lengths, plans)):
        summary = micro_batch_summary(lengths, parts, cap)
        rows.append(
            {
                "rank": rank,
                "samples": int(len(lengths)),
                "tokens": int(lengths.sum()),
                "lower_bound": int(summary["lower_bound"]),
                "micro_batches": int(summary["count"]),
                "fill": float(summary["fill"]),
                "workload_imbalance": float(summary["workload_imbalance"]),
                "largest_micro_batch": int(summary["max_tokens"]),
                "micro_batch_tokens": [int(t) for t in summary["tokens"]],
            }
        )
    return rows


_COLUMNS = [
    ("rank", "rank", "{}"),
    ("samples", "samples", "{}"),
    ("tokens", "tokens", "{}"),
    ("lower_bound", "lower bound", "{}"),
    ("micro_batches", "micro-batches", "{}"),
    ("fill", "fill %", "{:.1%}"),
    ("workload_imbalance", "workload max/mean", "{:.3f}"),
    ("largest_micro_batch", "largest micro-batch", "{}"),
]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Fixed-width table of the per-rank rows (fill shown as a percentage)."""
    cells = [[title for _, title, _ in _COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[key]).replace("%", "") if key == "fill" else fmt.format(row[key]) for key, _, fmt in _COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _plot(path: str, report: dict[str, Any], cap: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(
            "--plot needs matplotlib, which is not installed; pip install 'seqbal[plot]' (or drop --plot)"
        ) from None
    methods = [("seqbal", report["seqbal"]["ranks"])]
    if report["kk_loop"]["ranks"]:
        methods.append(("older KK loop", report["kk_loop"]["ranks"]))
    figure, axes = plt.subplots(len(methods), 1, figsize=(10, 3.2 * len(methods)), squeeze=False)
    for axis, (name, rows) in zip(axes[:, 0], methods):
        offset = 0
        for row in rows:
            tokens = row["micro_batch_tokens"]
            axis.bar(range(offset, offset + len(tokens)), tokens, width=0.85, label=f"rank {row['rank']}")
            offset += len(tokens) + 1
        axis.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"cap {cap}")
        total = sum(row["micro_batches"] for row in rows)
        axis.set_title(f"{name}: {total} micro-batches over {len(rows)} rank(s)")
        axis.set_ylabel("effective tokens")
        axis.set_xticks([])
        if len(rows) <= 8:
            axis.legend(loc="lower right", fontsize=7, ncol=min(len(rows) + 1, 5))
    axes[-1, 0].set_xlabel("micro-batches, rank by rank")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=100)
    except OSError as error:
        raise InputError(f"{path}: cannot write the plot ({error.strerror or error})") from None
    finally:
        plt.close(figure)


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    """Read, split, plan with seqbal and with the older loop; the dict ``--json`` prints."""
    if args.dp < 1:
        raise InputError(f"--dp must be >= 1, got {args.dp}")
    if args.group_size < 1:
        raise MicroBatchPlanError(f"force_group_size must be an int >= 1, got {args.group_size}", MicroBatchPlanError.BAD_ARGUMENT)
    lengths = read_lengths(args.file, field=args.field, column=args.column)
    split = split_over_ranks(lengths, args.dp, args.group_size, args.seed)
    plans = simulate_ranks(
        split.lengths,
        args.max_token_len,
        force_group_size=args.group_size,
        num_batches_divided_by=args.divisible_by,
        min_num_micro_batch=args.min_micro_batches,
    )
    old = kk_loop_plans(
        split.lengths,
        args.max_token_len,
        force_group_size=args.group_size,
        num_batches_divided_by=args.divisible_by,
        min_num_micro_batch=args.min_micro_batches,
    )
    return {
        "input": {
            "file": str(args.file) if args.file else f"{DEFAULT_SAMPLE.name} (shipped sample)",
            "samples": int(len(lengths)),
            "tokens": int(lengths.sum()),
            "max_length": int(lengths.max()),
        },
        "settings": {
            "max_token_len": args.max_token_len,
            "dp": args.dp,
            "group_size": args.group_size,
            "divisible_by": args.divisible_by,
            "min_micro_batches": args.min_micro_batches,
            "seed": args.seed,
        },
        "seqbal": {
            "micro_batches_per_rank": len(plans[0]),
            "all_reduces": 2 if args.dp > 1 else 0,
            "ranks": _rank_rows(split.lengths, plans, args.max_token_len),
        },
        "kk_loop": {
            "micro_batches_per_rank": len(old.parts[0]) if old.parts else None,
            "kk_passes": old.passes,
            "all_reduces": (1 + old.passes) if args.dp > 1 else 0,
            "failed_at": old.failed_at,
            "ranks": _rank_rows(split.lengths, old.parts, args.max_token_len) if old.parts else [],
        },
    }


def format_report(report: dict[str, Any]) -> str:
    """The human-readable output of ``seqbal plan``."""
    source, settings = report["input"], report["settings"]
    ours, old = report["seqbal"], report["kk_loop"]
    defaults = {"group_size": 1, "divisible_by": None, "min_micro_batches": None, "seed": None}
    names = {"group_size": "group size", "divisible_by": "divisible by",
             "min_micro_batches": "min micro-batches", "seed": "seed"}
    extras = [f"{names[key]}={settings[key]}" for key in names if settings[key] != defaults[key]]
    lines = [
        f"input: {source['file']}: {source['samples']} samples, {source['tokens']} tokens, longest {source['max_length']}",
        f"settings: max_token_len={settings['max_token_len']}, dp={settings['dp']}"
        + (", " + ", ".join(extras) if extras else ""),
        "",
        f"seqbal: {ours['micro_batches_per_rank']} micro-batches per rank"
        + (f", agreed in {ours['all_reduces']} all-reduces" if settings["dp"] > 1 else ""),
        format_table(ours["ranks"]),
        "",
    ]
    if old["ranks"]:
        lines.append(
            f"older KK loop: {old['micro_batches_per_rank']} micro-batches per rank after {old['kk_passes']} KK pass(es)"
            + (f", {old['all_reduces']} all-reduces" if settings["dp"] > 1 else "")
        )
        lines.append(format_table(old["ranks"]))
        total_ours = sum(r["micro_batches"] for r in ours["ranks"])
        total_old = sum(r["micro_batches"] for r in old["ranks"])
        if total_old > total_ours:
            lines += ["", f"seqbal runs {total_old - total_ours} fewer micro-batches in total "
                          f"({total_ours} vs {total_old}, {1 - total_ours / total_old:.1%} fewer)."]
        elif total_old == total_ours:
            lines += ["", f"same micro-batch count ({total_ours}) as the older loop on this input."]
    else:
        lines.append(
            f"older KK loop: failed, it reached {old['failed_at']} micro-batches, more than some rank has "
            f"groups, after {old['kk_passes']} KK pass(es)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqbal", description="Strict-cap, balanced micro-batching of variable-length sequences.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    plan = commands.add_parser(
        "plan",
        help="show the micro-batches seqbal makes for a length distribution",
        description=(
            "Show the micro-batches seqbal makes for a length distribution, per simulated "
            "data-parallel rank, next to the older KK loop."
        ),
        epilog=(
            "FILE formats: text (one integer per line), .npy (1-D integer array), .jsonl (an integer, "
            "a list of token ids, or an object with --field), .parquet (--column, needs pyarrow). "
            "Exit codes: 0 ok, 2 impossible settings or unreadable input."
        ),
    )
    plan.add_argument("file", nargs="?", help="lengths file; default: the shipped Qwen2.5-Math rollout sample (800 lengths)")
    plan.add_argument("--field", help=".jsonl: key holding the length (or token list) in each object")
    plan.add_argument("--column", help=".parquet: column holding the lengths (or token lists)")
    plan.add_argument("--max-token-len", type=int, default=DEFAULT_MAX_TOKEN_LEN,
                      help=f"hard cap on effective tokens per micro-batch (default {DEFAULT_MAX_TOKEN_LEN})")
    plan.add_argument("--dp", type=int, default=1, help="simulated data-parallel ranks (default 1)")
    plan.add_argument("--group-size", type=int, default=1, help="force_group_size: samples kept together (default 1)")
    plan.add_argument("--divisible-by", type=int, default=None, help="num_batches_divided_by (default none)")
    plan.add_argument("--min-micro-batches", type=int, default=None, help="min_num_micro_batch (default none)")
    plan.add_argument("--seed", type=int, default=None, help="shuffle groups with this seed before splitting over ranks")
    plan.add_argument("--json", action="store_true", help="print the report as JSON")
    plan.add_argument("--plot", metavar="FILE.png", help="draw micro-batch token fill against the cap (needs matplotlib)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``seqbal`` command line; returns the exit code (0 ok, 2 usage or input error)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        report = build_report(args)
        if args.plot:
            _plot(args.plot, report, args.max_token_len)
    except (MicroBatchPlanError, InputError) as error:
        print(f"seqbal plan: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 - promised: no traceback; say it is a bug
        if os.environ.get("SEQBAL_DEBUG"):
            raise
        print(f"seqbal plan: internal error ({type(error).__name__}: {error}); "
              f"please report it (SEQBAL_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    if args.json:
        for method in ("seqbal", "kk_loop"):
            for row in report[method]["ranks"]:
                row["fill"] = round(row["fill"], 6)
                row["workload_imbalance"] = round(row["workload_imbalance"], 6)
        text = json.dumps(report, indent=2)
    else:
        text = format_report(report) + (f"\n\nplot written to {args.plot}" if args.plot else "")
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
