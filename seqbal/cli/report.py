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
import re
import textwrap
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .lengths import MAX_INT64, InputError, check_groups_fit, check_workload_range, read_lengths
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
#: The text report's width unless the terminal is wider or ``--width`` says otherwise.
DEFAULT_WIDTH = 80

#: (key, title on one line, title on two lines, format) of the per-rank table.
_COLUMNS = [
    ("rank", "rank", ("", "rank"), "{}"),
    ("samples", "samples", ("", "samples"), "{}"),
    ("tokens", "tokens", ("", "tokens"), "{}"),
    ("packing_bound", "packing bound", ("packing", "bound"), "{}"),
    ("micro_batches", "micro-batches", ("micro-", "batches"), "{}"),
    ("fill", "fill %", ("fill", "%"), "{:.1%}"),
    ("workload_imbalance", "workload max/mean", ("workload", "max/mean"), "{:.3f}"),
    ("largest_micro_batch", "largest micro-batch", ("largest", "tokens"), "{}"),
]


def format_table(
    rows: Sequence[dict[str, Any]], *, with_cost: bool = False, max_samples: Optional[int] = None,
    width: Optional[int] = None,
) -> str:
    """Fixed-width table of the per-rank rows (fill shown as a percentage); ``with_cost`` adds
    the largest micro-batch cost under a cost model other than effective tokens; ``max_samples``
    (the sample cap, where given) adds the most samples of a micro-batch against it.

    The widest layout that fits ``width`` columns (None: no limit): titles on one line, else on
    two lines, else on two lines with the columns one space apart. O(ranks x columns).

    >>> print(format_table([dict(rank=0, samples=3, tokens=30, packing_bound=1, micro_batches=1, fill=0.75,
    ...                          workload_imbalance=1.0, largest_micro_batch=30)], width=66))
                           packing   micro-  fill  workload  largest
    rank  samples  tokens    bound  batches     %  max/mean   tokens
    ----  -------  ------  -------  -------  ----  --------  -------
       0        3      30        1        1  75.0     1.000       30
    """
    columns = _COLUMNS + ([("largest_cost", "largest cost", ("largest", "cost"), "{}")] if with_cost else [])
    if max_samples is not None:
        columns = columns + [("most_samples", f"most samples (cap {max_samples})", ("most samples", f"(cap {max_samples})"), "{}")]
    values = [[fmt.format(row[key]).replace("%", "") for key, _, _, fmt in columns] for row in rows]
    layouts = [([[title for _, title, _, _ in columns]], "  "),
               ([[pair[0] for _, _, pair, _ in columns], [pair[1] for _, _, pair, _ in columns]], "  "),
               ([[pair[0] for _, _, pair, _ in columns], [pair[1] for _, _, pair, _ in columns]], " ")]
    for titles, gap in layouts:
        cells = titles + values
        widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
        lines = [gap.join(cell.rjust(w) for cell, w in zip(line, widths)).rstrip() for line in titles]
        lines.append(gap.join("-" * w for w in widths))
        lines += [gap.join(cell.rjust(w) for cell, w in zip(line, widths)) for line in values]
        if width is None or max(map(len, lines)) <= width:
            break
    return "\n".join(lines)


#: A planning time as printed (``12 ms``, ``1.3 s``): what differs from run to run.
_DURATION = re.compile(r"\b\d+(?:\.\d+)? (?:ms|s)\b")
#: Room a wrapped line keeps for each duration in it, the width of ``9999 ms`` or ``9999.9 s``.
_DURATION_ROOM = 8


def _wrap(text: str, width: int, indent: str = "    ") -> list[str]:
    """``text`` wrapped to ``width`` columns, continuation lines indented by ``indent``.

    Each duration in it is wrapped as a word of :data:`_DURATION_ROOM` characters whatever its
    digits, so where a line breaks never depends on the clock (the docs' examples compare the
    output of a run with times left out), and a line is never wider than ``width``."""
    found = _DURATION.findall(text)
    room = max([_DURATION_ROOM] + [len(d) for d in found])
    hold = "\0" * room
    lines = textwrap.wrap(_DURATION.sub(hold, text), width=width, subsequent_indent=indent,
                          break_on_hyphens=False, break_long_words=False)
    back = iter(found)
    out = []
    for line in lines:
        pieces = line.split(hold)
        out.append("".join(piece + (next(back) if i < len(pieces) - 1 else "") for i, piece in enumerate(pieces)))
    return out


def _timed(function: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def _micro_batches(count: int) -> str:
    return f"{count} micro-batch" + ("" if count == 1 else "es")


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


#: ``--max-token-len`` when not given, where every sample (forced group) fits under it.
DEFAULT_MAX_TOKEN_LEN = 4096


def _cap_from_data(lengths: Any, group_size: int, cost_model: Optional[CostModel]) -> tuple[int, str]:
    """The cap when ``--max-token-len`` is not given, and where it came from: the default
    (:data:`DEFAULT_MAX_TOKEN_LEN`) where every sample or forced group fits under it ("default"),
    else the smallest power of two above it that holds the costliest one ("data"), so that
    16k-scale data plans instead of failing on a value the user never typed. O(n)."""
    values = lengths.values
    if len(values) % group_size:  # check_groups_fit names this error
        return DEFAULT_MAX_TOKEN_LEN, "default"
    costs = (cost_model or CostModel()).group_costs(values, group_size)
    needed = int(costs.max()) if len(costs) else 0
    if needed <= DEFAULT_MAX_TOKEN_LEN:
        return DEFAULT_MAX_TOKEN_LEN, "default"
    cap = DEFAULT_MAX_TOKEN_LEN
    while cap < needed:
        cap *= 2
    return min(cap, MAX_INT64), "data"


def build_report(
    args: argparse.Namespace, stdin: Optional[io.TextIOBase] = None, progress: Optional[Progress] = None
) -> dict[str, Any]:
    """Read, split, plan with seqbal and (when compared) with verl; the dict ``--json`` prints."""
    progress = progress or Progress(quiet=True)
    progress.phase(f"reading {args.file or 'the shipped sample'}")
    lengths = read_lengths(args.file, field=args.field, column=args.column, stdin=stdin)
    check_workload_range(lengths)
    source = "given"
    if args.max_token_len is None:
        args.max_token_len, source = _cap_from_data(lengths, args.group_size, args.cost_model)
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
            "max_token_len_source": source,
            "default_max_token_len": DEFAULT_MAX_TOKEN_LEN,
            "cost_model": str(args.cost_model),
            "dp": args.dp,
            "route": args.route,
            "group_size": args.group_size,
            "divisible_by": args.divisible_by,
            "min_micro_batches": args.min_micro_batches,
            "max_samples_per_micro_batch": args.max_samples_per_micro_batch,
            "order": getattr(args, "order", "pipeline"),
            "seed": args.seed,
            "compare": compare,
            "compare_option": args.compare,
            "kk_sets_per_pass": sets,
        },
        "seqbal": {
            "micro_batches_per_rank": len(plans[0]),
            # each rank's micro_batch_tokens are listed in this run order
            "micro_batch_order": getattr(args, "order", "pipeline"),
            "all_reduces": 0 if args.dp == 1 or args.route == "schedule" else 2,
            "seconds": seconds,
            "ranks": _rank_rows(split.lengths, plans, args.max_token_len, args.cost_model, args.group_size,
                                args.max_samples_per_micro_batch),
        },
        "verl_0_9": None,
        "verl_0_8": None,
        "comparison_error": None,
        "routes": None,
        "impossible_input": dict(IMPOSSIBLE_INPUT),
    }
    if not compare:
        return report
    try:
        report["verl_0_9"], report["verl_0_8"] = _compare_with_verl(split, args, progress)
    except Exception as error:  # noqa: BLE001 - the comparison is extra: its failure never takes the plan down
        report["settings"]["compare"] = False
        report["comparison_error"] = f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]
        return report
    if args.dp > 1:
        progress.phase("seqbal on the other routes")
        routes = {}
        for route in ROUTES:
            other = (split, plans) if route == args.route else None
            if other is None:
                try:  # a comparison the user did not ask for: its failure is a row, not an exit
                    other_split = _split(lengths, args, route)
                    other = (other_split, _seqbal_on(other_split, args))
                except (InputError, ValueError) as error:
                    routes[route] = {"micro_batches_per_rank": None, "fill": None, "rank_workload_imbalance": None,
                                     "error": " ".join(str(error).split())}
                    continue
            rows = _rank_rows(other[0].lengths, other[1], args.max_token_len, args.cost_model, args.group_size,
                              args.max_samples_per_micro_batch)
            routes[route] = {
                "micro_batches_per_rank": len(other[1][0]),
                "fill": sum(r["tokens"] for r in rows) / (sum(r["micro_batches"] for r in rows) * args.max_token_len),
                "rank_workload_imbalance": _rank_imbalance(other[0].lengths, getattr(args, "workload_fn", None)),
                "error": None,
            }
        report["routes"] = routes
    return report


def _rank_imbalance(rank_lengths: Sequence[np.ndarray], workload_fn: Optional[Callable[[Any], Any]] = None) -> float:
    from ..workload import calculate_workload

    work = [float(np.asarray((workload_fn or calculate_workload)(lengths)).sum()) for lengths in rank_lengths]
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


def _headline(report: dict[str, Any], width: int) -> list[str]:
    """What changes for the user against verl: count, largest micro-batch, time, impossible input.

    One row per library (the columns do not grow with the verl version's name), and the times
    on a wrapped line of their own: a column's padding must not depend on the clock."""
    settings, ours = report["settings"], report["seqbal"]
    strict, single = report["verl_0_9"], report["verl_0_8"]
    dp, cap = settings["dp"], settings["max_token_len"]
    other_cost = settings["cost_model"] != str(CostModel())
    name = strict["name"]
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
    ranks = f"the {dp} simulated ranks, one after another" if dp > 1 else "one rank"
    title = "seqbal against verl on this input, per rank" + (
        f" (largest micro-batch: its {settings['cost_model']})" if other_cost else "") + ":"
    lines = _wrap(title, width)
    lines += _grid([
        ["", "micro-batches", "largest micro-batch"],
        ["seqbal", str(ours["micro_batches_per_rank"]), f"{ours_largest} (cap {cap})"],
        [f"{name} (strict loop)", verl_count, verl_largest],
        ["verl <= 0.8 (one pass)", old_count, old_largest],
    ])
    imported = strict["verl_import_seconds"]
    impossible = report["impossible_input"]
    notes = [
        f"planning time ({ranks}, on this machine): seqbal {_duration(ours['seconds'])}, "
        f"{name} {_duration(strict['seconds'])}, verl <= 0.8 {_duration(single['seconds'])}.",
        f"{name} ran: {strict['implementation']}.",
        f"verl <= 0.8 ran: {single['implementation']}.",
        f"a sample over the cap: seqbal raises {impossible['seqbal']}; verl 0.8 and 0.9.1 raise {impossible['verl']}.",
    ]
    if imported is not None:
        notes.append(f"(importing verl took {_duration(imported)}, not counted in its planning time)")
    for note in notes:
        lines += _wrap(note, width)
    return lines


_TABLE_NOTES = {
    "fill": "fill: tokens / (micro-batches x cap)",
    "workload": "workload max/mean: the workload of the rank's heaviest micro-batch over the mean "
                "(attention is quadratic; 1.000 is even)",
}


def format_report(report: dict[str, Any], width: int = DEFAULT_WIDTH) -> str:
    """The human-readable output of ``seqbal plan``, every line at most ``width`` columns (the
    per-rank table's numbers aside, on absurd inputs)."""
    source, settings = report["input"], report["settings"]
    ours = report["seqbal"]
    dp = settings["dp"]
    other_cost = settings["cost_model"] != str(CostModel())  # a cost other than effective tokens
    defaults = {"group_size": 1, "divisible_by": None, "min_micro_batches": None, "seed": None,
                "max_samples_per_micro_batch": None, "order": "pipeline"}
    names = {"group_size": "group size", "divisible_by": "divisible by",
             "min_micro_batches": "min micro-batches", "seed": "seed",
             "max_samples_per_micro_batch": "max samples per micro-batch", "order": "micro-batch order"}
    extras = [f"{names[key]}={settings.get(key, defaults[key])}" for key in names
              if settings.get(key, defaults[key]) != defaults[key]]
    route = f", ranks split by {_ROUTE_NAMES[settings['route']]}" if dp > 1 else ""
    cap_source = {"given": "", "default": " (the default; --max-token-len sets it)",
                  "data": f" (--max-token-len not given: the smallest power of two from "
                          f"{settings.get('default_max_token_len')} up that holds every sample)"}
    lines = _wrap(f"input: {source['file']}: {source['samples']} samples, {source['tokens']} tokens, "
                  f"longest {source['max_length']}", width)
    lines += _wrap(
        f"settings: max_token_len={settings['max_token_len']}"
        + cap_source[settings.get("max_token_len_source", "given")]
        + (f" on the {settings['cost_model']}" if other_cost else "")
        + f", dp={dp}" + route
        + (", " + ", ".join(extras) if extras else ""), width)
    lines.append("")
    strict, single = report["verl_0_9"], report["verl_0_8"]
    if strict is not None:
        lines += _headline(report, width) + [""]
    lines += _wrap(
        f"seqbal: {_micro_batches(ours['micro_batches_per_rank'])} per rank"
        + (f", agreed in {ours['all_reduces']} all-reduces" if ours["all_reduces"] else "")
        + f" (planned in {_duration(ours['seconds'])})", width)
    lines += format_table(ours["ranks"], with_cost=other_cost, max_samples=settings.get("max_samples_per_micro_batch"),
                          width=width).splitlines()
    lines += _wrap(
        "packing bound: no plan of the rank's samples has fewer micro-batches"
        + (f" on the {settings['cost_model']}" if other_cost else "")
        + (", nor fewer than ceildiv(groups, max samples // group size)"
           if settings.get("max_samples_per_micro_batch") else "")
        + " (--json also gives ceildiv(tokens, cap), where verl starts)", width)
    for note in _TABLE_NOTES.values():
        lines += _wrap(note, width)
    if strict is None and report.get("comparison_error"):
        lines += [""] + _wrap(f"comparison with verl skipped: verl's code could not plan this input "
                              f"({report['comparison_error']}); seqbal's plan above is complete", width)
        return "\n".join(lines)
    if strict is None:
        reason = (f"verl's Karmarkar-Karp would build {settings['kk_sets_per_pass']:,} sets per pass here "
                  f"(samples x micro-batches, all ranks; auto compares up to {COMPARE_AUTO_MAX_KK_SETS:,}, "
                  f"a few seconds); --compare on forces it"
                  if settings["compare_option"] == "auto" else "--compare off")
        lines += [""] + _wrap(f"comparison with verl and the other routes skipped: {reason}", width)
        return "\n".join(lines)
    total_ours = ours["micro_batches_per_rank"] * dp
    name = strict["name"]
    lines.append("")
    paragraphs = []
    if strict["ranks"]:
        paragraphs.append(
            f"{name} (strict loop): {strict['micro_batches_per_rank']} micro-batches per rank, "
            f"{strict['kk_passes']} KK pass(es)" + (f", {strict['all_reduces']} all-reduces" if dp > 1 else "")
            + f" ({_duration(strict['seconds'])}), largest {max(r['largest_micro_batch'] for r in strict['ranks'])}"
            + (f"; on the {settings['cost_model']}: {sum(r['over_cap'] for r in strict['ranks'])} over the cap, "
               f"largest cost {max(r['largest_cost'] for r in strict['ranks'])}" if other_cost else "")
        )
    elif strict["failed_at"] is not None:
        paragraphs.append(f"{name} (strict loop): fails, it reaches {strict['failed_at']} micro-batches, more than "
                          f"some rank has groups, after {strict['kk_passes']} KK pass(es)")
    else:
        paragraphs.append(f"{name} (strict loop): fails: {'; '.join(strict['errors'] or ['no result'])}")
    if single["failed"]:
        paragraphs.append("verl <= 0.8 (one KK pass): fails, its count is more than some rank has samples")
    else:
        paragraphs.append(
            f"verl <= 0.8 (one KK pass): {single['micro_batches_per_rank']} micro-batches per rank, "
            f"{single['over_cap']} over the cap, largest {single['largest_micro_batch']} ({_duration(single['seconds'])})"
        )
    if strict["ranks"]:
        total_old = strict["micro_batches_per_rank"] * dp
        if total_old > total_ours:
            paragraphs.append(f"seqbal runs {total_old - total_ours} fewer micro-batches in total than {name} "
                              f"({total_ours} vs {total_old}, {1 - total_ours / total_old:.1%} fewer), all within the cap.")
        elif total_old == total_ours:
            paragraphs.append(f"same micro-batch count as {name} on this input ({total_ours} in total).")
        else:
            paragraphs.append(f"{name} runs {total_ours - total_old} fewer micro-batches in total on this input "
                              f"({total_old} vs {total_ours}).")
        if settings.get("max_samples_per_micro_batch") is not None:  # verl's counts answer another question
            paragraphs.append(f"{name} has no cap on samples per micro-batch: its count plans tokens alone, "
                              f"seqbal's also keeps max_samples_per_micro_batch={settings['max_samples_per_micro_batch']}.")
        over = sum(r["over_cap"] for r in strict["ranks"])
        if over:  # verl plans effective tokens: under another cost its micro-batches can exceed the cap
            paragraphs.append(f"but {over} of {name}'s micro-batches exceed max_token_len on the "
                              f"{settings['cost_model']}; seqbal's are all within it.")
    for paragraph in paragraphs:
        lines += _wrap(paragraph, width)
    if report["routes"]:
        lines += [""] + _routes(report["routes"], settings["route"], dp, width)
    return "\n".join(lines)


def _routes(routes: dict[str, dict[str, Any]], shown: str, dp: int, width: int) -> list[str]:
    """seqbal's count, fill and rank balance under each ``--route``; a route that cannot plan
    this input says so in its row, and why below the table."""
    lines = _wrap(f"seqbal on each --route over {dp} ranks (rank max/mean: the heaviest rank's workload over the "
                  f"mean, 1.000 is even):", width)
    rows = [["route", "micro-batches", "fill", "rank max/mean", ""]]
    failures = []
    for route_name, row in routes.items():
        mark = "(shown above)" if route_name == shown else ""
        if row.get("error"):
            failures.append((route_name, row["error"]))
            rows.append([route_name, f"cannot plan ({len(failures)})", "", "", mark])
        else:
            rows.append([route_name, str(row["micro_batches_per_rank"]), f"{row['fill']:.1%}",
                         f"{row['rank_workload_imbalance']:.3f}", mark])
    lines += _grid(rows)
    for number, (route_name, error) in enumerate(failures, 1):
        lines += _wrap(f"({number}) {route_name}: seqbal cannot plan the ranks it makes: {error}", width)
    return lines
