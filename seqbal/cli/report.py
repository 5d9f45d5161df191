"""The report: what changes for the user, then the per-rank figures, as text or JSON.

It leads with what changes for the user against what they run today, named by verl version:
planning time, micro-batch count, the largest micro-batch against the cap, and what happens on
an impossible input (:data:`IMPOSSIBLE_INPUT`); then the per-rank figures
(:func:`format_table`). :func:`build_report` gathers the figures once, so the text and the JSON
output say the same thing.
"""

from __future__ import annotations

import argparse
import io
import textwrap
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .lengths import check_groups_fit, check_workload_range, read_lengths
from ..cost import CostModel
from ..partition.progress import watching
from .compare import COMPARE_AUTO_MAX_KK_SETS, Progress, _compare_with_verl, kk_sets_per_pass
from .ranks import ROUTES, _rank_rows, _seqbal_on, _split


#: What each library does when a sample does not fit the cap (verl 0.8.0 and 0.9.1 alike: the
#: ``assert max_token_len >= max_seq_len`` at the top of ``rearrange_micro_batches``).
IMPOSSIBLE_INPUT = {
    "seqbal": "a ValueError on every rank, agreed before any rank raises",
    "verl": "an AssertionError on the rank that holds it, before its first all-reduce, where the "
            "other ranks then wait until the collective times out",
}
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


def format_table(
    rows: Sequence[dict[str, Any]], *, with_cost: bool = False, max_samples: Optional[int] = None
) -> str:
    """Fixed-width table of the per-rank rows (fill shown as a percentage); ``with_cost`` adds
    the largest micro-batch cost under a cost model other than effective tokens; ``max_samples``
    (the sample cap, where given) adds the most samples of a micro-batch against it."""
    columns = _COLUMNS + ([("largest_cost", "largest cost", "{}")] if with_cost else [])
    if max_samples is not None:
        columns = columns + [("most_samples", f"most samples (cap {max_samples})", "{}")]
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


def build_report(
    args: argparse.Namespace, stdin: Optional[io.TextIOBase] = None, progress: Optional[Progress] = None
) -> dict[str, Any]:
    """Read, split, plan with seqbal and (when compared) with verl; the dict ``--json`` prints."""
    progress = progress or Progress(io.StringIO())
    progress.phase(f"reading {args.file or 'the shipped sample'}")
    lengths = read_lengths(args.file, field=args.field, column=args.column, stdin=stdin)
    check_workload_range(lengths)
    check_groups_fit(lengths, args.max_token_len, args.group_size, args.cost_model)
    planning = f"planning {len(lengths.values):,} samples with seqbal"
    progress.phase(planning)
    items, planned = max(1, len(lengths.values) // args.group_size), [0]

    def planned_more(count: int) -> None:  # the count search's items (groups), chunk by chunk
        planned[0] += count
        progress.fraction(planning, planned[0], items)

    # seqbal's time is the ranks' planning; for the schedule route that is the split itself
    with watching(planned_more):
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
            "max_samples_per_micro_batch": args.max_samples_per_micro_batch,
            "seed": args.seed,
            "compare": compare,
            "compare_option": args.compare,
            "kk_sets_per_pass": sets,
        },
        "seqbal": {
            "micro_batches_per_rank": len(plans[0]),
            "all_reduces": 0 if args.dp == 1 or args.route == "schedule" else 2,
            "seconds": seconds,
            "ranks": _rank_rows(split.lengths, plans, args.max_token_len, args.cost_model, args.group_size,
                                args.max_samples_per_micro_batch),
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
            rows = _rank_rows(other[0].lengths, other[1], args.max_token_len, args.cost_model, args.group_size,
                              args.max_samples_per_micro_batch)
            routes[route] = {
                "micro_batches_per_rank": len(other[1][0]),
                "fill": sum(r["tokens"] for r in rows) / (sum(r["micro_batches"] for r in rows) * args.max_token_len),
                "rank_workload_imbalance": _rank_imbalance(other[0].lengths),
            }
        report["routes"] = routes
    return report


def _rank_imbalance(rank_lengths: Sequence[np.ndarray]) -> float:
    from ..workload import calculate_workload

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
    defaults = {"group_size": 1, "divisible_by": None, "min_micro_batches": None, "seed": None,
                "max_samples_per_micro_batch": None}
    names = {"group_size": "group size", "divisible_by": "divisible by",
             "min_micro_batches": "min micro-batches", "seed": "seed",
             "max_samples_per_micro_batch": "max samples per micro-batch"}
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
        format_table(ours["ranks"], with_cost=other_cost, max_samples=settings.get("max_samples_per_micro_batch")),
        "packing bound: no plan of the rank's samples has fewer micro-batches"
        + (f" on the {settings['cost_model']}" if other_cost else "")
        + (", nor fewer than ceildiv(groups, max samples // group size)"
           if settings.get("max_samples_per_micro_batch") else "")
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
        if settings.get("max_samples_per_micro_batch") is not None:  # verl's counts answer another question
            lines.append(f"{name} has no cap on samples per micro-batch: its count plans tokens alone, "
                         f"seqbal's also keeps max_samples_per_micro_batch={settings['max_samples_per_micro_batch']}.")
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
