"""The command line's parser and :func:`main`, the ``seqbal`` console entry point.

The CLI never shows a traceback and every bad input exits with code 2 and one line starting
``seqbal: error:``: argument values are range-checked by argparse, and reading
(:mod:`.lengths`) names the file and line of unusable input and the lines of a sample or
group over the cap; the library's own errors are printed as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any, Callable, Optional, Sequence

from .. import __version__
from .lengths import InputError, MAX_INT64, read_lengths
from ..cost import CostModel
from ..order import MICRO_BATCH_ORDERS
from .compare import COMPARE_AUTO_MAX_KK_SETS, Progress
from .plot import _plot, _plot_path
from .ranks import ROUTES
from .report import DEFAULT_MAX_TOKEN_LEN, DEFAULT_WIDTH, _wrap, build_report, format_report


EXIT_USAGE = 2
#: Every error line of the command starts with this, whichever part of it found the error.
ERROR_PREFIX = "seqbal: error:"


def _error_line(message: str) -> str:
    return f"{ERROR_PREFIX} {' '.join(str(message).split())}"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line with the command's one prefix (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{_error_line(message)} (see '{self.prog} --help')\n")


def _range_words(low: int, high: int) -> str:
    """``a positive integer`` rather than ``an integer from 1 to 9223372036854775807``: the int64
    ceiling is a limit of the arithmetic, not a number a user chooses from."""
    if high >= MAX_INT64:
        return {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer of at least {low}")
    return f"an integer from {low} to {high}"


def _int_in(low: int, high: int = MAX_INT64) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r:.40}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {_range_words(low, high)}, got {text!r:.40}")
        return value

    parse.__name__ = "integer"
    return parse


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="seqbal", description="Strict-cap, balanced micro-batching of variable-length sequences.")
    parser.add_argument("--version", action="version", version=f"seqbal {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    plan = commands.add_parser(
        "plan",
        help="show the micro-batches seqbal makes for a length distribution",
        description=(
            "Show the micro-batches seqbal makes for a length distribution, per simulated "
            "data-parallel rank, next to what verl >= 0.9 and verl <= 0.8 make."
        ),
        epilog=(
            "FILE formats: text (one integer per line), .npy (1-D integer array), .jsonl (an integer, "
            "a list of token ids, or an object with --field), .parquet (--column, needs pyarrow); "
            "'-' reads standard input (text, or jsonl with --field). A length is prompt + response: "
            "--field prompt_len+response_len sums fields. "
            "Exit codes: 0 ok, 2 impossible settings or unreadable input (one line on stderr)."
        ),
    )
    positive = _int_in(1)
    plan.add_argument("file", nargs="?", help="lengths file, or - for standard input; default: the shipped "
                                              "Qwen2.5-Math rollout sample (800 lengths)")
    plan.add_argument("--field", metavar="NAME[+NAME]", help=".jsonl: key holding the length (or token list) in each object; "
                                      "a sum of keys with + (prompt_len+response_len)")
    plan.add_argument("--column", metavar="NAME[+NAME]", help=".parquet: column holding the lengths (or token lists); sums with +")
    plan.add_argument("--max-token-len", metavar="N", type=positive, default=None,
                      help=f"hard cap on effective tokens per micro-batch (default {DEFAULT_MAX_TOKEN_LEN}, or where a "
                           f"sample is longer the smallest power of two that holds every sample; the report says which)")
    plan.add_argument("--cost", choices=("tokens", "padded"), default="tokens",
                      help="what --max-token-len caps: tokens (effective tokens, for remove-padding forwards; the "
                           "default) or padded (samples x longest, for padded forwards)")
    plan.add_argument("--round-to", metavar="M", type=positive, default=1,
                      help="round every length up to a multiple of M before costing it (sequence parallelism, FP8)")
    plan.add_argument("--pack-round-to", metavar="B", type=positive, default=1,
                      help="tokens cost: round each packed micro-batch up to a multiple of B (Ulysses sp_size)")
    plan.add_argument("--dp", metavar="N", type=positive, default=1, help="simulated data-parallel ranks (default 1)")
    plan.add_argument("--route", choices=ROUTES, default="balance_batch",
                      help="how samples reach the ranks: balance_batch (verl's driver-side balance, the default), "
                           "contiguous (consecutive chunks), schedule (seqbal's build_dp_schedule, which also "
                           "decides the micro-batches)")
    plan.add_argument("--group-size", metavar="G", type=positive, default=1, help="force_group_size: samples kept together (default 1)")
    plan.add_argument("--divisible-by", metavar="D", type=positive, default=None, help="num_batches_divided_by (default none)")
    plan.add_argument("--min-micro-batches", metavar="M", type=positive, default=None, help="min_num_micro_batch (default none)")
    plan.add_argument("--max-samples-per-micro-batch", metavar="S", type=positive, default=None,
                      help="max_samples_per_micro_batch: hard cap on samples per micro-batch, a forced group counting "
                           "--group-size (default none)")
    plan.add_argument("--seed", metavar="S", type=_int_in(0), default=None, help="shuffle groups with this seed before splitting over ranks")
    plan.add_argument("--compare", choices=("auto", "on", "off"), default="auto",
                      help=f"compare with verl (its own code where installed) and the other routes: auto (default) "
                           f"does it while verl's KK builds at most {COMPARE_AUTO_MAX_KK_SETS:,} sets per pass "
                           f"(samples x micro-batches), a few seconds; it grows as their product")
    plan.add_argument("--memory-budget", metavar="BYTES", type=positive, default=None,
                      help="with --calibration: choose --max-token-len from memory: the largest cap whose worst "
                           "micro-batch of FILE's lengths is predicted within BYTES less the calibration's margin")
    plan.add_argument("--calibration", metavar="FILE.json",
                      help="a calibration saved by seqbal.memory.calibrate(...).save(FILE.json)")
    plan.add_argument("--model-config", metavar="CONFIG.json",
                      help="balance on the forward FLOPs of this transformers config.json (seqbal.workload_from_config) "
                           "instead of the default 24576 * s + s^2, and print its coefficients")
    plan.add_argument("--order", choices=MICRO_BATCH_ORDERS, default="pipeline",
                      help="the order each rank runs its micro-batches in, as listed by --json: pipeline (light ones "
                           "at both ends, the default) or largest_first (what the cap bounds, largest first: the "
                           "caching allocator reserves its largest blocks once); the trainers' micro_batch_order")
    plan.add_argument("--json", action="store_true", help="print the report as JSON")
    plan.add_argument("-q", "--quiet", action="store_true",
                      help="no progress on standard error (by default each phase of a run is one line there; "
                           "on a terminal, one line redrawn in place and erased at the end)")
    plan.add_argument("--width", metavar="COLUMNS", type=_int_in(40, 1000), default=None,
                      help=f"width of the text report (default {DEFAULT_WIDTH}, or the terminal's width where it is wider)")
    plan.add_argument("--plot", metavar="FILE.png", help="draw micro-batch token fill against the cap (needs matplotlib; "
                                                         ".png, .pdf or .svg; no extension means .png)")
    return parser


def _report_width(asked: Optional[int]) -> int:
    """``--width``, else the terminal's width where standard output is a terminal wider than
    :data:`DEFAULT_WIDTH`, else :data:`DEFAULT_WIDTH` (pipes, files and logs get 80 columns)."""
    if asked is not None:
        return asked
    isatty = getattr(sys.stdout, "isatty", None)
    if isatty is not None and isatty():
        return max(DEFAULT_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)
    return DEFAULT_WIDTH


def _memory_cap(args: argparse.Namespace) -> tuple[int, str]:
    """The token cap a saved calibration gives under ``--memory-budget`` for the lengths of
    ``args.file`` (standard input: the calibration's own length range), and why. The cap is
    planned on as if given with ``--max-token-len``; with a cost other than tokens it applies
    to that cost's lengths all the same (the calibration is of the model's step as it ran)."""
    from ..memory import Calibration

    calibration = Calibration.load(args.calibration)
    if args.file == "-":
        calibration = calibration.rebudget(args.memory_budget)
    else:
        lengths = read_lengths(args.file, field=args.field, column=args.column).values
        calibration = calibration.rebudget(args.memory_budget, lengths=lengths)
    cap = calibration.max_token_len
    if cap < 1:
        raise ValueError(f"--memory-budget {args.memory_budget}: not even one sequence of "
                         f"{calibration.length_range[0] if calibration.length_range else 1} tokens is predicted within "
                         f"{calibration.byte_cap} bytes ({calibration.margin:.0%} margin) under {args.calibration}")
    return cap, calibration.explain()


def _config_workload(path: str) -> tuple[Any, str]:
    """The workload of a transformers ``config.json`` and the line that states its coefficients."""
    from ..workload_config import workload_from_config

    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--model-config {path}: cannot read it ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"--model-config {path}: expected a JSON object (a config.json), got {type(config).__name__}")
    try:
        workload = workload_from_config(config)
    except ValueError as error:
        raise ValueError(f"--model-config {path}: {error}") from None
    c = workload.coefficients
    return workload, (f"forward FLOPs of {path}: {c['per_token']:,} per token + {c['per_token_squared']:,} per "
                      f"token^2 (causal attention), balanced as workloads of 1/{workload.unit:,} of that")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``seqbal`` command line; returns the exit code (0 ok, 2 usage or input error)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("a command is required: seqbal plan [FILE] [options]")
    try:
        args.cost_model = CostModel(padded=args.cost == "padded", round_to=args.round_to, pack_round_to=args.pack_round_to)
    except ValueError as error:
        parser.error(f"--cost {args.cost}: {error}")
    memory_note = None
    if (args.memory_budget is None) != (args.calibration is None):
        parser.error("--memory-budget and --calibration go together")
    if args.calibration is not None:
        try:
            args.max_token_len, memory_note = _memory_cap(args)
        except (InputError, ValueError) as error:
            print(_error_line(error), file=sys.stderr)
            return EXIT_USAGE
    workload_note = None
    args.workload_fn = None
    if args.model_config is not None:
        try:
            args.workload_fn, workload_note = _config_workload(args.model_config)
        except ValueError as error:
            print(_error_line(error), file=sys.stderr)
            return EXIT_USAGE
    progress = Progress(quiet=args.quiet)
    try:
        plot = _plot_path(args.plot) if args.plot else None
        report = build_report(args, progress=progress)
        if plot:
            progress.phase(f"drawing {plot}")
            _plot(plot, report, args.max_token_len)
    except (InputError, ValueError, OverflowError) as error:
        # ValueError covers MicroBatchPlanError and the schedule's own errors: all are input errors.
        progress.done()
        print(_error_line(error), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        progress.done()
        return 130
    except Exception as error:  # noqa: BLE001 - promised: no traceback; say it is a bug
        progress.done()
        if os.environ.get("SEQBAL_DEBUG"):
            raise
        print(f"{ERROR_PREFIX} internal error ({type(error).__name__}: {error}); "
              f"please report it (SEQBAL_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    progress.done()
    if args.json:
        if workload_note:
            report["workload"] = {"model_config": args.model_config, **args.workload_fn.coefficients,
                                  "unit": args.workload_fn.unit, "why": workload_note}
        if memory_note:
            report["memory"] = {"calibration": args.calibration, "memory_budget": args.memory_budget,
                                "max_token_len": args.max_token_len, "why": memory_note}
        for method in ("seqbal", "verl_0_9"):
            for row in (report[method] or {}).get("ranks", []):
                row["fill"] = round(row["fill"], 6)
                row["workload_imbalance"] = round(row["workload_imbalance"], 6)
        text = json.dumps(report, indent=2)
    else:
        width = _report_width(args.width)
        text = format_report(report, width) + (f"\n\nplot written to {plot}" if plot else "")
        if memory_note:
            text = "\n".join(_wrap(f"memory: {memory_note}", width)) + f"\n{text}"
        if workload_note:
            text = "\n".join(_wrap(f"workload: {workload_note}", width)) + f"\n{text}"
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
