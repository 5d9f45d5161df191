"""What the slot evening's stops cost and buy: ``build_dp_schedule`` at 32,768 x 32 per variant.

The schedule's 12-pass target asks for ``build_dp_schedule`` at 32,768 samples on 32 ranks within 12
best-fit-decreasing passes *and* its step efficiency unchanged. Rounds of same-trade speed-ups
(``docs/benchmarks.md``, "Planning cost of the schedule") left the slot evening
(``seqbal/schedule/slots.py``) at up to 21 passes on its own, and every change of its order
or budget measured so far moved some row's efficiency. This script puts that choice on one
table: for each variant of the evening's stops (set around :func:`_even_slots` only, so the
rank polish keeps its own :data:`SLOT_CLOSE_ENOUGH`; ``excess-*`` sets
:data:`seqbal.schedule.slots.SLOT_MIN_EXCESS`, off as shipped), on the 32 cases of
``bench_schedule.py --planning-cost``, the cost in BFD passes (CPU time, one process, the
median of ``--rounds``, rounds interleaved over cases and variants, the variants' order
alternating) and each row's step efficiency against today's, per micro-batch and per step
(``DPSchedule.step_efficiency``). The evening only trades groups between micro-batches, so
no variant may change a count; the script checks that.

Run from the repository root::

    python -m benchmarks.schedule_tradeoff                 # every variant, 3 rounds (about 15 minutes)
    python -m benchmarks.schedule_tradeoff --rounds 5 --variants close-1e-3 budget-16
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

from benchmarks import bench_schedule as bs
from benchmarks.planning_cost import cpu_ms
from seqbal import best_fit_decreasing_partitions, build_dp_schedule
from seqbal.schedule import slots

#: The evening's constants per variant (names in ``seqbal.schedule.slots``); ``today``: as shipped.
VARIANTS: dict[str, dict[str, float]] = {
    "today": {},
    "close-1e-4": {"SLOT_CLOSE_ENOUGH": 1.0001},
    "close-1e-3": {"SLOT_CLOSE_ENOUGH": 1.001},
    "budget-32": {"SLOT_BUDGET_PER_SLOT": 32},
    "budget-16": {"SLOT_BUDGET_PER_SLOT": 16},
    "steps-16": {"SLOT_STEPS": 16},
    "close-1e-4+budget-16": {"SLOT_CLOSE_ENOUGH": 1.0001, "SLOT_BUDGET_PER_SLOT": 16},
    "close-1e-3+budget-16": {"SLOT_CLOSE_ENOUGH": 1.001, "SLOT_BUDGET_PER_SLOT": 16},
    "close-1e-3+budget-8": {"SLOT_CLOSE_ENOUGH": 1.001, "SLOT_BUDGET_PER_SLOT": 8},
    # a slot is even once its excess over its mean is this fraction of the whole step
    "excess-1e-6": {"SLOT_MIN_EXCESS": 1e-6},
    "excess-3e-6": {"SLOT_MIN_EXCESS": 3e-6},
    "excess-1e-5": {"SLOT_MIN_EXCESS": 1e-5},
    "excess-3e-5": {"SLOT_MIN_EXCESS": 3e-5},
    "excess-1e-4": {"SLOT_MIN_EXCESS": 1e-4},
}
#: The schedule's 12-pass target, in BFD passes.
TARGET = 12.0
CAPS = (16384, 32768)


@contextmanager
def evening_with(constants: dict[str, float]) -> Iterator[None]:
    """While inside, :func:`seqbal.schedule.slots._even_slots` runs with ``constants`` in place
    of the module's; they are set only for the evening's own call, and restored after it."""
    original = slots._even_slots

    def patched(bins: Any, grid: Any, budget: Any = None) -> None:
        saved = {name: getattr(slots, name) for name in constants}
        for name, value in constants.items():
            setattr(slots, name, value)
        try:
            original(bins, grid, budget)
        finally:
            for name, value in saved.items():
                setattr(slots, name, value)

    # _aligned, its caller on the path measured here (no sample cap, no equal_samples), looks it
    # up in the module at each call
    slots._even_slots = patched
    try:
        yield
    finally:
        slots._even_slots = original


def measure(
    names: Sequence[str], variants: Sequence[str], n: int, dp: int, rounds: int, caps: Sequence[int] = CAPS
) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Per (variant, workload, cap): the median ratio to one BFD pass, the count and both step
    efficiencies. ``today`` is always measured (the others are compared with it). Raises
    ``RuntimeError`` if a variant changes a count."""
    variants = ["today"] + [v for v in variants if v != "today"]
    cases = [(name, cap, *bs.planning_cost_case(name, cap, n)) for name in names for cap in caps]
    ratios: dict[tuple[str, str, int], list[float]] = {}
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for round_index in range(rounds):
        for name, cap, lengths, group_ids in cases:
            bfd, _ = cpu_ms(lambda: best_fit_decreasing_partitions(lengths, cap))
            for variant in variants if round_index % 2 == 0 else variants[::-1]:
                with evening_with(VARIANTS[variant]):
                    ms, schedule = cpu_ms(lambda: build_dp_schedule(lengths, dp, cap, group_ids=group_ids))
                key = (variant, name, cap)
                ratios.setdefault(key, []).append(ms / bfd)
                efficiency = schedule.step_efficiency()
                rows[key] = dict(
                    count=schedule.num_micro_batches, per_micro_batch=efficiency["per_micro_batch"],
                    per_step=efficiency["per_step"],
                )
    for (variant, name, cap), row in rows.items():
        row["ratio"] = statistics.median(ratios[(variant, name, cap)])
        if row["count"] != rows[("today", name, cap)]["count"]:
            raise RuntimeError(f"{variant} changed the count of {name} at cap {cap}: the evening must not")
    return rows


def summary(rows: dict[tuple[str, str, int], dict[str, Any]]) -> list[str]:
    """One Markdown row per variant: worst ratio, cases within :data:`TARGET`, and the efficiency
    it loses (positive) or gains against ``today``, row by row."""
    variants = list(dict.fromkeys(v for v, _, _ in rows))
    cases = [(name, cap) for v, name, cap in rows if v == "today"]
    lines = [
        "| variant | worst BFD passes | cases within 12 | rows below today (per micro-batch / per step) "
        "| largest loss per micro-batch | largest loss per step | largest gain per micro-batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        ratio = {case: rows[(variant, *case)]["ratio"] for case in cases}
        worst = max(cases, key=lambda case: ratio[case])
        loss = {
            column: {case: rows[("today", *case)][column] - rows[(variant, *case)][column] for case in cases}
            for column in ("per_micro_batch", "per_step")
        }
        at_mb = max(cases, key=lambda case: loss["per_micro_batch"][case])
        at_st = max(cases, key=lambda case: loss["per_step"][case])
        lines.append(
            f"| {variant} | {ratio[worst]:.1f}x ({worst[0]}, {worst[1]}) "
            f"| {sum(r <= TARGET for r in ratio.values())} of {len(cases)} "
            f"| {sum(x > 0 for x in loss['per_micro_batch'].values())} / {sum(x > 0 for x in loss['per_step'].values())} "
            f"| {max(0.0, loss['per_micro_batch'][at_mb]):.1e} ({at_mb[0]}, {at_mb[1]}) "
            f"| {max(0.0, loss['per_step'][at_st]):.1e} ({at_st[0]}, {at_st[1]}) "
            f"| {max(0.0, -min(loss['per_micro_batch'].values())):.1e} |"
        )
    return lines


def per_case(rows: dict[tuple[str, str, int], dict[str, Any]]) -> list[str]:
    """One Markdown row per case: every variant's ratio and efficiencies."""
    variants = list(dict.fromkeys(v for v, _, _ in rows))
    lines = ["| workload | cap | " + " | ".join(variants) + " |", "|---|---|" + "---|" * len(variants)]
    for name, cap in [(name, cap) for v, name, cap in rows if v == "today"]:
        cells = [
            f"{rows[(v, name, cap)]['ratio']:.1f}x {rows[(v, name, cap)]['per_micro_batch']:.6f} / "
            f"{rows[(v, name, cap)]['per_step']:.6f}" for v in variants
        ]
        lines.append(f"| {name} | {cap} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--names", nargs="*", help="workloads (default: every one of bench_schedule --planning-cost)")
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--dp", type=int, default=32)
    args = parser.parse_args(argv)
    rows = measure(args.names or bs.planning_cost_names(), args.variants, args.n, args.dp, args.rounds)
    cases = len([1 for v, _, _ in rows if v == "today"])
    print(f"build_dp_schedule, {args.n} samples on {args.dp} ranks, {cases} cases, median of {args.rounds} rounds\n")
    print("\n".join(summary(rows)))
    print("\nPer case, BFD passes (median) and step efficiency per micro-batch / per step:\n")
    print("\n".join(per_case(rows)))


if __name__ == "__main__":
    main()
