"""``seqbal plan``: see what seqbal will do with your lengths before you launch a run.

The command reads a length distribution (a text file, ``.npy``, ``.jsonl``, ``.parquet``, ``-``
for standard input, or the real rollout sample shipped in ``seqbal/data``), splits it over
simulated data-parallel ranks the way the trainer would (``--route``: verl's driver-side
``balance_batch`` by default, contiguous chunks, or seqbal's global ``build_dp_schedule``), and
applies the decision the ranks would make together. It leads with what changes for the user
against what they run today, named by verl version: planning time, micro-batch count, the
largest micro-batch against the cap, and what happens on an impossible input; then the per-rank
figures.

The verl side is verl's own code where verl is installed (:mod:`seqbal._verl_run`: verl 0.9.1's
``rearrange_micro_batches``, one thread per simulated rank, its all-reduces served in-process),
else a re-implementation that does verl's work (:mod:`seqbal._kk_loop`); the report says which
ran. A faster stand-in would make seqbal look slower than it is against the verl users run.

The CLI never shows a traceback and every bad input exits with code 2 and one line starting
``seqbal: error:``: argument values are range-checked by argparse, and reading
(``_length_input.py``) names the file and line of unusable input and the lines of a sample or
group over the cap; the library's own errors are printed as they are. The simulation is the
public :func:`~seqbal.plan_data_parallel`: the library's own agreement protocol with the
all-reduces replaced by a max/min over the simulated ranks. Long runs show their phase on
standard error when it is a terminal, never on standard output.

verl's Karmarkar-Karp builds ``k`` set objects per sample per pass (``k`` the micro-batch
count), so the comparison grows as samples x micro-batches and takes minutes on large inputs:
by default it runs only up to :data:`COMPARE_AUTO_MAX_KK_SETS` of them; ``--compare on|off``
overrides the rule.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import __version__
from ._verl_run import VerlCode, load_verl, one_pass_0_8, reimplemented_strict_loop, verl_strict_loop
from ._length_input import (
    DEFAULT_SAMPLE,
    MAX_INT64,
    InputError,
    Lengths,
    check_groups_fit,
    check_workload_range,
    read_lengths,
)
from .cost import CostModel, padded_min_count
from .metrics import micro_batch_summary
from .partition import ceildiv, packing_lower_bound
from .plan import plan_data_parallel

__all__ = ["main", "read_lengths", "split_over_ranks", "simulate_ranks", "DEFAULT_SAMPLE", "COMPARE_AUTO_MAX_KK_SETS"]

DEFAULT_MAX_TOKEN_LEN = 4096
EXIT_USAGE = 2
#: ``--compare auto`` compares with verl and the other routes while verl's KK builds at most this
#: many set objects per pass over all ranks (groups x micro-batches at verl's first count). One
#: pass costs about 10 us per set in a process that has torch loaded (the shipped sample, 800
#: samples at cap 4096: 75,200 sets, 0.7 s per pass, 3 passes); above this it is opt-in.
COMPARE_AUTO_MAX_KK_SETS = 200_000
#: What each library does when a sample does not fit the cap (verl 0.8.0 and 0.9.1 alike: the
#: ``assert max_token_len >= max_seq_len`` at the top of ``rearrange_micro_batches``).
IMPOSSIBLE_INPUT = {
    "seqbal": "a ValueError on every rank, agreed before any rank raises",
    "verl": "an AssertionError on the rank that holds it, before its first all-reduce, where the "
            "other ranks then wait until the collective times out",
}
ROUTES = ("balance_batch", "contiguous", "schedule")
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


# ---------------------------------------------------------------------------------------------
# Simulating data-parallel ranks
# ---------------------------------------------------------------------------------------------


@dataclass
class RankSplit:
    """Per simulated rank: its lengths, the input positions they came from, and (for the
    ``schedule`` route, which decides micro-batches too) its micro-batches."""

    lengths: list[np.ndarray]
    indices: list[np.ndarray]
    plans: Optional[list[list[list[int]]]] = None


def _shuffled_groups(n: int, group_size: int, seed: Optional[int]) -> np.ndarray:
    """Input positions in sampler order: whole groups, shuffled with ``seed`` when given."""
    order = np.arange(n // group_size)
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(order))
    return (order[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)


def split_over_ranks(
    lengths: np.ndarray,
    dp: int,
    group_size: int = 1,
    seed: Optional[int] = None,
    route: str = "contiguous",
    *,
    max_token_len: Optional[int] = None,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    cost_model: Optional[CostModel] = None,
) -> RankSplit:
    """Deal ``lengths`` out to ``dp`` ranks in whole forced groups, the way a trainer would.

    Groups are first put in sampler order (shuffled with ``seed``), then:

    * ``contiguous``: ``dp`` consecutive chunks (sizes differ by at most one group), as a
      dataloader does without balancing;
    * ``balance_batch``: :func:`seqbal.balance_batch`, verl's driver-side balance (KK on workloads,
      equal group counts when ``dp`` divides them);
    * ``schedule``: :func:`seqbal.build_dp_schedule`, which also decides the micro-batches
      (``max_token_len`` and the count constraints are needed then).

    Raises:
        InputError: ``group_size`` does not divide the number of samples, or fewer groups than ranks.
    """
    n = len(lengths)
    if n % group_size:
        raise InputError(f"--group-size {group_size} does not divide the number of samples {n}")
    groups = n // group_size
    if groups < dp:
        raise InputError(f"cannot split {groups} group(s) of {group_size} sample(s) over --dp {dp} ranks")
    order = _shuffled_groups(n, group_size, seed)
    ordered = lengths[order]
    if route == "contiguous":
        chunks = np.array_split(np.arange(groups), dp)
        positions = [(c[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1) for c in chunks]
        return RankSplit([ordered[p] for p in positions], [order[p] for p in positions])
    if route == "balance_batch":
        from .schedule import balance_batch

        group_ids = None if group_size == 1 else (np.arange(n) // group_size).tolist()
        parts, _ = balance_batch(ordered, dp, equal_size=groups % dp == 0, group_ids=group_ids)
        positions = [np.asarray(p, dtype=np.int64) for p in parts]
        return RankSplit([ordered[p] for p in positions], [order[p] for p in positions])
    if route == "schedule":
        from .schedule import build_dp_schedule

        if max_token_len is None:
            raise ValueError("the schedule route needs max_token_len")
        schedule = build_dp_schedule(
            ordered, dp, max_token_len, force_group_size=group_size,
            num_batches_divided_by=num_batches_divided_by, min_num_micro_batch=min_num_micro_batch,
            cost_model=cost_model,
        )
        positions = [np.asarray(r, dtype=np.int64) for r in schedule.rank_indices]
        return RankSplit(
            [ordered[p] for p in positions], [order[p] for p in positions],
            [schedule.local_micro_batches(r) for r in range(dp)],
        )
    raise ValueError(f"unknown route {route!r}; expected one of {ROUTES}")


def simulate_ranks(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    cost_model: Optional[CostModel] = None,
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
        cost_model=cost_model,
    )


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def packing_bound(lengths: np.ndarray, cap: int, group_size: int = 1, cost_model: Optional[CostModel] = None) -> int:
    """Fewer micro-batches than this cannot hold ``lengths`` under ``cap``, on the chosen cost.

    Token cost: :func:`~seqbal.packing_lower_bound` of the forced groups' (rounded) tokens under
    the cap (lowered to a multiple of ``pack_round_to``). Padded cost:
    :func:`~seqbal.cost.padded_min_count`, the exact fewest for groups of equal size. Either is
    at least ``ceildiv(tokens, cap)``, the bound verl starts from, and often above it.

    Examples:
        >>> packing_bound(np.array([7] * 8), 8), ceildiv(56, 8)
        (8, 7)
        >>> packing_bound(np.array([3000] * 4 + [200] * 60), 4096, cost_model=CostModel(padded=True))
        7
    """
    cost_model = cost_model or CostModel()
    measured = cost_model.rounded(np.asarray(lengths, dtype=np.int64)).reshape(-1, group_size)
    if cost_model.padded:
        return padded_min_count(measured.max(axis=1), group_size, cap)
    return packing_lower_bound(measured.sum(axis=1), max(cost_model.token_capacity(cap), 1))


def _rank_rows(
    rank_lengths: Sequence[np.ndarray], plans: Sequence[list[list[int]]], cap: int,
    cost_model: Optional[CostModel] = None, group_size: int = 1,
) -> list[dict[str, Any]]:
    cost_model = cost_model or CostModel()
    rows = []
    for rank, (lengths, parts) in enumerate(zip(rank_lengths, plans)):
        summary = micro_batch_summary(lengths, parts, cap)
        costs = cost_model.part_costs(lengths, parts)
        rows.append(
            {
                "rank": rank,
                "samples": int(len(lengths)),
                "tokens": int(lengths.sum()),
                "packing_bound": packing_bound(lengths, cap, group_size, cost_model),
                "ceildiv_bound": ceildiv(int(lengths.sum()), cap),
                "micro_batches": int(summary["count"]),
                "fill": float(summary["fill"]),
                "workload_imbalance": float(summary["workload_imbalance"]),
                "largest_micro_batch": int(summary["max_tokens"]),
                "largest_cost": max(costs),
                "over_cap": sum(cost > cap for cost in costs),
                "micro_batch_tokens": [int(t) for t in summary["tokens"]],
            }
        )
    return rows


_COLUMNS = [
    ("rank", "rank", "{}"),
    ("samples", "samples", "{}"),
    ("tokens", "tokens", "{}"),
    ("packing_bound", "packing bound", "{}"),
    ("micro_batches", "micro-batches", "{}"),
    ("fill", "fill %", "{:.1%}"),
    ("workload_imbalance", "workload max/mean", "{:.3f}"),
    ("largest_micro_batch", "largest micro-batch", "{}"),
]


def format_table(rows: Sequence[dict[str, Any]], *, with_cost: bool = False) -> str:
    """Fixed-width table of the per-rank rows (fill shown as a percentage); ``with_cost`` adds
    the largest micro-batch cost under a cost model other than effective tokens."""
    columns = _COLUMNS + ([("largest_cost", "largest cost", "{}")] if with_cost else [])
    cells = [[title for _, title, _ in columns]]
    for row in rows:
        cells.append([fmt.format(row[key]).replace("%", "") if key == "fill" else fmt.format(row[key]) for key, _, fmt in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _timed(function: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def _micro_batches(count: int) -> str:
    return f"{count} micro-batch" + ("" if count == 1 else "es")


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _plot_path(path: str) -> str:
    """The file ``--plot`` writes: ``path`` itself, or ``path.png`` when it has no extension.

    Checked before any planning, matplotlib included, so a long run does not end in an error.
    """
    suffix = Path(path).suffix.lower()
    if suffix and suffix not in PLOT_SUFFIXES:
        raise InputError(f"--plot {path}: the plot is an image; give a file ending in {', '.join(PLOT_SUFFIXES)}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            "--plot needs matplotlib, which is not installed; pip install 'seqbal[plot]' (or drop --plot)"
        ) from None
    return path if suffix else path + ".png"


def plot_figure(report: dict[str, Any], cap: int) -> Any:
    """The ``--plot`` figure: every micro-batch's tokens, rank by rank, against the cap; one panel
    for seqbal and one for verl's strict loop when it was compared. The legend (one colour per
    rank, up to 16 ranks, and the cap) sits to the right of the panels, never over the bars.

    Raises:
        InputError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(
            "--plot needs matplotlib, which is not installed; pip install 'seqbal[plot]' (or drop --plot)"
        ) from None
    methods = [("seqbal", report["seqbal"]["ranks"])]
    strict = report.get("verl_0_9")
    if strict and strict["ranks"]:
        methods.append((strict.get("name", "verl >= 0.9"), strict["ranks"]))
    figure, axes = plt.subplots(len(methods), 1, figsize=(11, 3.2 * len(methods)), squeeze=False)
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
        axis.set_xlim(-1, offset)
        if len(rows) <= 16:
            axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=7,
                        ncol=1 if len(rows) <= 8 else 2)
    axes[-1, 0].set_xlabel("micro-batches, rank by rank")
    figure.tight_layout()
    return figure


def _plot(path: str, report: dict[str, Any], cap: int) -> None:
    figure = plot_figure(report, cap)
    import matplotlib.pyplot as plt

    try:
        figure.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as error:
        raise InputError(f"{path}: cannot write the plot ({error.strerror or error})") from None
    finally:
        plt.close(figure)


def _seqbal_on(split: RankSplit, args: argparse.Namespace) -> list[list[list[int]]]:
    if split.plans is not None:
        return split.plans
    return simulate_ranks(
        split.lengths, args.max_token_len, force_group_size=args.group_size,
        num_batches_divided_by=args.divisible_by, min_num_micro_batch=args.min_micro_batches,
        cost_model=args.cost_model,
    )


def _split(lengths: Lengths, args: argparse.Namespace, route: str) -> RankSplit:
    return split_over_ranks(
        lengths.values, args.dp, args.group_size, args.seed, route, max_token_len=args.max_token_len,
        num_batches_divided_by=args.divisible_by, min_num_micro_batch=args.min_micro_batches,
        cost_model=args.cost_model,
    )


def kk_sets_per_pass(rank_lengths: Sequence[np.ndarray], max_token_len: int, group_size: int = 1) -> int:
    """Set objects verl's Karmarkar-Karp builds in one pass over all ranks: per rank, its groups
    times verl's first count ``min(groups, ceildiv(tokens, cap))``. What the comparison costs.

    >>> kk_sets_per_pass([np.array([4096] * 10), np.array([100] * 10)], 4096)
    110
    """
    total = 0
    for lengths in rank_lengths:
        groups = len(lengths) // group_size
        total += groups * max(1, min(groups, ceildiv(int(lengths.sum()), max_token_len)))
    return total


class Progress:
    """The current phase of a long run on standard error, only when that is a terminal.

    One line, rewritten in place and erased at the end, so nothing of it is left in the
    terminal, and nothing at all goes to a pipe, a file or standard output.
    """

    def __init__(self, stream: Optional[Any] = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.active = bool(isatty and isatty())
        self.shown = False

    def phase(self, text: str) -> None:
        if self.active:
            self.stream.write(f"\r\033[Kseqbal: {text} ...")
            self.stream.flush()
            self.shown = True

    def done(self) -> None:
        if self.active and self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


class _OneTorchThread:
    """torch on one thread while the comparison runs, then as it was. Both sides plan on one
    thread; on a machine whose cores are busy, torch's thread pool makes every small tensor op
    wait for them (tens of ms each), which would time the machine, not the code."""

    def __enter__(self) -> "_OneTorchThread":
        import torch

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.set_num_threads(self.threads)


def _compare_with_verl(split: RankSplit, args: argparse.Namespace, progress: Progress) -> tuple[dict, dict]:
    """verl >= 0.9 (strict loop) and verl <= 0.8 (one pass) on the ranks seqbal planned."""
    options = dict(force_group_size=args.group_size, num_batches_divided_by=args.divisible_by,
                   min_num_micro_batch=args.min_micro_batches)
    progress.phase("importing verl for the comparison")
    code: VerlCode = load_verl()
    dp = len(split.lengths)
    with _OneTorchThread():
        if code.module is not None:
            progress.phase(f"verl {code.version}: rearrange_micro_batches on {dp} rank(s)")
            strict = verl_strict_loop(code, split.lengths, args.max_token_len, **options)
            ran, name = "verl", f"verl {code.version}"
            what = (f"verl {code.version}'s own rearrange_micro_batches"
                    + (", one thread per rank, its all-reduces served in-process" if dp > 1 else ""))
            single_what = (f"verl {code.version}'s own Karmarkar-Karp (the same code as verl 0.8.0's), "
                           f"one pass at verl 0.8's count")
        else:
            progress.phase(f"verl >= 0.9, re-implemented: the strict loop on {dp} rank(s)")
            strict = reimplemented_strict_loop(split.lengths, args.max_token_len, **options)
            ran, name = "reimplementation", "verl >= 0.9"
            what = f"seqbal's re-implementation of verl 0.9.1's rearrange_micro_batches, doing its work ({code.reason})"
            single_what = "seqbal's re-implementation of verl's Karmarkar-Karp, one pass at verl 0.8's count"
        progress.phase("verl <= 0.8: one KK pass")
        single, single_seconds = one_pass_0_8(code, split.lengths, args.max_token_len, **options)
    strict_report = {
        "ran": ran,
        "name": name,
        "implementation": what,
        "verl_version": code.version,
        "verl_import_seconds": code.import_seconds if code.module is not None else None,
        "micro_batches_per_rank": len(strict.parts[0]) if strict.parts else None,
        "kk_passes": strict.passes,
        "all_reduces": strict.all_reduces,
        "failed_at": strict.failed_at,
        "errors": [e for e in strict.errors if e] or None,
        "seconds": strict.seconds,
        "ranks": (_rank_rows(split.lengths, strict.parts, args.max_token_len, args.cost_model, args.group_size)
                  if strict.parts else []),
    }
    single_report = {
        "ran": ran,
        "implementation": single_what,
        "micro_batches_per_rank": single.count if single.parts else None,
        "over_cap": single.over_cap,
        "largest_micro_batch": single.largest,
        "failed": single.parts is None,
        "seconds": single_seconds,
    }
    return strict_report, single_report


def build_report(
    args: argparse.Namespace, stdin: Optional[io.TextIOBase] = None, progress: Optional[Progress] = None
) -> dict[str, Any]:
    """Read, split, plan with seqbal and (when compared) with verl; the dict ``--json`` prints."""
    progress = progress or Progress(io.StringIO())
    progress.phase(f"reading {args.file or 'the shipped sample'}")
    lengths = read_lengths(args.file, field=args.field, column=args.column, stdin=stdin)
    check_workload_range(lengths)
    check_groups_fit(lengths, args.max_token_len, args.group_size, args.cost_model)
    progress.phase(f"planning {len(lengths.values)} samples with seqbal")
    # seqbal's time is the ranks' planning; for the schedule route that is the split itself
    split, split_seconds = _timed(lambda: _split(lengths, args, args.route))
    plans, seconds = _timed(lambda: _seqbal_on(split, args))
    if args.route == "schedule":
        seconds = split_seconds
    sets = kk_sets_per_pass(split.lengths, args.max_token_len, args.group_size)
    compare = args.compare == "on" or (args.compare == "auto" and sets <= COMPARE_AUTO_MAX_KK_SETS)
    report: dict[str, Any] = {
        "input": {
            "file": lengths.name,
            "samples": int(len(lengths.values)),
            "tokens": int(sum(lengths.values.tolist())),
            "max_length": int(lengths.values.max()),
        },
        "settings": {
            "max_token_len": args.max_token_len,
            "cost_model": str(args.cost_model),
            "dp": args.dp,
            "route": args.route,
            "group_size": args.group_size,
            "divisible_by": args.divisible_by,
            "min_micro_batches": args.min_micro_batches,
            "seed": args.seed,
            "compare": compare,
            "compare_option": args.compare,
            "kk_sets_per_pass": sets,
        },
        "seqbal": {
            "micro_batches_per_rank": len(plans[0]),
            "all_reduces": 0 if args.dp == 1 or args.route == "schedule" else 2,
            "seconds": seconds,
            "ranks": _rank_rows(split.lengths, plans, args.max_token_len, args.cost_model, args.group_size),
        },
        "verl_0_9": None,
        "verl_0_8": None,
        "routes": None,
        "impossible_input": dict(IMPOSSIBLE_INPUT),
    }
    if not compare:
        return report
    report["verl_0_9"], report["verl_0_8"] = _compare_with_verl(split, args, progress)
    if args.dp > 1:
        progress.phase("seqbal on the other routes")
        routes = {}
        for route in ROUTES:
            other = (split, plans) if route == args.route else None
            if other is None:
                other_split = _split(lengths, args, route)
                other = (other_split, _seqbal_on(other_split, args))
            rows = _rank_rows(other[0].lengths, other[1], args.max_token_len, args.cost_model, args.group_size)
            routes[route] = {
                "micro_batches_per_rank": len(other[1][0]),
                "fill": sum(r["tokens"] for r in rows) / (sum(r["micro_batches"] for r in rows) * args.max_token_len),
                "rank_workload_imbalance": _rank_imbalance(other[0].lengths),
            }
        report["routes"] = routes
    return report


def _rank_imbalance(rank_lengths: Sequence[np.ndarray]) -> float:
    from .workload import calculate_workload

    work = [float(calculate_workload(lengths).sum()) for lengths in rank_lengths]
    mean = sum(work) / len(work)
    return max(work) / mean if mean > 0 else 1.0


_ROUTE_NAMES = {
    "balance_batch": "balance_batch (verl's driver-side default)",
    "contiguous": "contiguous chunks",
    "schedule": "build_dp_schedule (global, on the driver)",
}


def _grid(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths))).rstrip() for row in rows]


def _largest(rows: Sequence[dict[str, Any]], other_cost: bool) -> int:
    return max(r["largest_cost"] if other_cost else r["largest_micro_batch"] for r in rows)


def _headline(report: dict[str, Any]) -> list[str]:
    """What changes for the user against verl: time, count, largest micro-batch, impossible input."""
    settings, ours = report["settings"], report["seqbal"]
    strict, single = report["verl_0_9"], report["verl_0_8"]
    dp, cap = settings["dp"], settings["max_token_len"]
    other_cost = settings["cost_model"] != str(CostModel())
    name = strict["name"]
    verl_time = _duration(strict["seconds"])
    ours_largest = _largest(ours["ranks"], other_cost)
    if strict["ranks"]:
        verl_count = str(strict["micro_batches_per_rank"])
        over = sum(r["over_cap"] for r in strict["ranks"])
        verl_largest = str(_largest(strict["ranks"], other_cost)) + (f", {over} over the cap" if over else "")
    else:
        verl_count = verl_largest = "fails" + (f" at {strict['failed_at']}" if strict["failed_at"] else "")
    if single["failed"]:
        old_count = old_largest = "fails"
    else:
        old_count = str(single["micro_batches_per_rank"])
        old_largest = f"{single['largest_micro_batch']}" + (f", {single['over_cap']} over the cap" if single["over_cap"] else "")
        if other_cost:
            old_largest += " (tokens)"
    largest = "largest micro-batch" + (f" ({settings['cost_model'].split(' (')[0]})" if other_cost else "")
    ranks = f"the {dp} simulated ranks, one after another" if dp > 1 else "one rank"
    # times are not in the grid: a column's padding must not depend on the clock
    lines = [
        "seqbal against verl on this input:",
        f"  planning time ({ranks}, on this machine): seqbal {_duration(ours['seconds'])}, {name} {verl_time}, "
        f"verl <= 0.8 {_duration(single['seconds'])}",
    ]
    lines += _grid([
        ["", "seqbal", f"{name} (strict loop)", "verl <= 0.8 (one pass)"],
        ["micro-batches per rank", str(ours["micro_batches_per_rank"]), verl_count, old_count],
        [largest, f"{ours_largest} (cap {cap})", verl_largest, old_largest],
    ])
    imported = strict["verl_import_seconds"]
    impossible = report["impossible_input"]
    notes = [  # no duration inside a wrapped note: where lines break must not depend on the clock
        f"{name} ran: {strict['implementation']}.",
        f"verl <= 0.8 ran: {single['implementation']}.",
        f"a sample over the cap: seqbal raises {impossible['seqbal']}; verl 0.8 and 0.9.1 raise {impossible['verl']}.",
    ]
    for note in notes:
        lines += textwrap.wrap(note, width=100, subsequent_indent="    ")
    if imported is not None:
        lines.append(f"(importing verl took {_duration(imported)}, not counted in its planning time)")
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The human-readable output of ``seqbal plan``."""
    source, settings = report["input"], report["settings"]
    ours = report["seqbal"]
    dp = settings["dp"]
    other_cost = settings["cost_model"] != str(CostModel())  # a cost other than effective tokens
    defaults = {"group_size": 1, "divisible_by": None, "min_micro_batches": None, "seed": None}
    names = {"group_size": "group size", "divisible_by": "divisible by",
             "min_micro_batches": "min micro-batches", "seed": "seed"}
    extras = [f"{names[key]}={settings[key]}" for key in names if settings[key] != defaults[key]]
    route = f", ranks split by {_ROUTE_NAMES[settings['route']]}" if dp > 1 else ""
    lines = [
        f"input: {source['file']}: {source['samples']} samples, {source['tokens']} tokens, longest {source['max_length']}",
        f"settings: max_token_len={settings['max_token_len']}"
        + (f" on the {settings['cost_model']}" if other_cost else "")
        + f", dp={dp}" + route
        + (", " + ", ".join(extras) if extras else ""),
        "",
    ]
    strict, single = report["verl_0_9"], report["verl_0_8"]
    if strict is not None:
        lines += _headline(report) + [""]
    lines += [
        f"seqbal: {_micro_batches(ours['micro_batches_per_rank'])} per rank"
        + (f", agreed in {ours['all_reduces']} all-reduces" if ours["all_reduces"] else "")
        + f" (planned in {_duration(ours['seconds'])})",
        format_table(ours["ranks"], with_cost=other_cost),
        "packing bound: no plan of the rank's samples has fewer micro-batches"
        + (f" on the {settings['cost_model']}" if other_cost else "")
        + " (--json also gives ceildiv(tokens, cap), where verl starts)",
    ]
    if strict is None:
        reason = (f"verl's Karmarkar-Karp would build {settings['kk_sets_per_pass']:,} sets per pass here "
                  f"(samples x micro-batches, all ranks; auto compares up to {COMPARE_AUTO_MAX_KK_SETS:,}, "
                  f"a few seconds); --compare on forces it"
                  if settings["compare_option"] == "auto" else "--compare off")
        lines += ["", f"comparison with verl and the other routes skipped: {reason}"]
        return "\n".join(lines)
    total_ours = ours["micro_batches_per_rank"] * dp
    name = strict["name"]
    lines.append("")
    if strict["ranks"]:
        lines.append(
            f"{name} (strict loop): {strict['micro_batches_per_rank']} micro-batches per rank, "
            f"{strict['kk_passes']} KK pass(es)" + (f", {strict['all_reduces']} all-reduces" if dp > 1 else "")
            + f" ({_duration(strict['seconds'])}), largest {max(r['largest_micro_batch'] for r in strict['ranks'])}"
            + (f"; on the {settings['cost_model']}: {sum(r['over_cap'] for r in strict['ranks'])} over the cap, "
               f"largest cost {max(r['largest_cost'] for r in strict['ranks'])}" if other_cost else "")
        )
    elif strict["failed_at"] is not None:
        lines.append(f"{name} (strict loop): fails, it reaches {strict['failed_at']} micro-batches, more than "
                     f"some rank has groups, after {strict['kk_passes']} KK pass(es)")
    else:
        lines.append(f"{name} (strict loop): fails: {'; '.join(strict['errors'] or ['no result'])}")
    if single["failed"]:
        lines.append("verl <= 0.8 (one KK pass): fails, its count is more than some rank has samples")
    else:
        lines.append(
            f"verl <= 0.8 (one KK pass): {single['micro_batches_per_rank']} micro-batches per rank, "
            f"{single['over_cap']} over the cap, largest {single['largest_micro_batch']} ({_duration(single['seconds'])})"
        )
    if strict["ranks"]:
        total_old = strict["micro_batches_per_rank"] * dp
        if total_old > total_ours:
            lines.append(f"seqbal runs {total_old - total_ours} fewer micro-batches in total than {name} "
                         f"({total_ours} vs {total_old}, {1 - total_ours / total_old:.1%} fewer), all within the cap.")
        elif total_old == total_ours:
            lines.append(f"same micro-batch count as {name} on this input ({total_ours} in total).")
        else:
            lines.append(f"{name} runs {total_ours - total_old} fewer micro-batches in total on this input "
                         f"({total_old} vs {total_ours}).")
        over = sum(r["over_cap"] for r in strict["ranks"])
        if over:  # verl plans effective tokens: under another cost its micro-batches can exceed the cap
            lines.append(f"but {over} of {name}'s micro-batches exceed max_token_len on the "
                         f"{settings['cost_model']}; seqbal's are all within it.")
    if report["routes"]:
        lines += ["", f"routes over {dp} ranks (seqbal micro-batches per rank, fill, rank workload max/mean):"]
        width = max(len(_ROUTE_NAMES[r]) for r in report["routes"])
        for route_name, row in report["routes"].items():
            mark = "  <- shown above" if route_name == settings["route"] else ""
            lines.append(f"  {_ROUTE_NAMES[route_name]:<{width}}  {row['micro_batches_per_rank']:>5}  {row['fill']:6.1%}  "
                         f"{row['rank_workload_imbalance']:.3f}{mark}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


#: Every error line of the command starts with this, whichever part of it found the error.
ERROR_PREFIX = "seqbal: error:"


def _error_line(message: str) -> str:
    return f"{ERROR_PREFIX} {' '.join(str(message).split())}"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line with the command's one prefix (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{_error_line(message)} (see '{self.prog} --help')\n")


def _int_in(low: int, high: int = MAX_INT64) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r:.40}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high}, got {text!r:.40}")
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
    plan.add_argument("--max-token-len", metavar="N", type=positive, default=DEFAULT_MAX_TOKEN_LEN,
                      help=f"hard cap on effective tokens per micro-batch (default {DEFAULT_MAX_TOKEN_LEN})")
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
    plan.add_argument("--seed", metavar="S", type=_int_in(0), default=None, help="shuffle groups with this seed before splitting over ranks")
    plan.add_argument("--compare", choices=("auto", "on", "off"), default="auto",
                      help=f"compare with verl (its own code where installed) and the other routes: auto (default) "
                           f"does it while verl's KK builds at most {COMPARE_AUTO_MAX_KK_SETS:,} sets per pass "
                           f"(samples x micro-batches), a few seconds; it grows as their product")
    plan.add_argument("--json", action="store_true", help="print the report as JSON")
    plan.add_argument("--plot", metavar="FILE.png", help="draw micro-batch token fill against the cap (needs matplotlib; "
                                                         ".png, .pdf or .svg; no extension means .png)")
    return parser


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
    progress = Progress()
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
        for method in ("seqbal", "verl_0_9"):
            for row in (report[method] or {}).get("ranks", []):
                row["fill"] = round(row["fill"], 6)
                row["workload_imbalance"] = round(row["workload_imbalance"], 6)
        text = json.dumps(report, indent=2)
    else:
        text = format_report(report) + (f"\n\nplot written to {plot}" if plot else "")
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
