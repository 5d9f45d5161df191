"""How full a ``micro_batches_per_step`` step is, against first-fit decreasing over the pool.

    python -m benchmarks.step_fill                # the table of docs/benchmarks.md
    python -m benchmarks.step_fill --steps 40     # shorter
    python -m benchmarks.step_fill --smoke        # seconds, for tests/test_benchmark_smoke.py
    python -m benchmarks.step_fill --oldest-first # the planner with oldest_first=True
    python -m benchmarks.step_fill --due-first    # max_wait_steps against FFD with the due groups first

:class:`seqbal.StepPlanner` with ``micro_batches_per_step=1`` on 4 ranks under a cap of 4096
tokens, fed groups of 4 samples (a group is never split): 4 random samples of one length list,
redrawn while their total is over the cap. Lists: every real list of ``../shared/data/lengths``
(the shipped rollouts alone where they are absent), and uniform lengths in ``[1, 1024]`` (a
group of 4 then spans the whole cap). Arrivals, per step:

* ``steady``: a Poisson number of groups, on average 90% of what a step can hold;
* ``outrun``: the pool is topped up to a random 50-90 groups before every step (arrivals
  outrun the steps; the planner always has a backlog);
* ``outrun, wait 20``: the same with ``max_wait_steps=20`` (the admission bound is then 84
  groups: the top-up stops there);
* ``steady, wait 2``: Poisson arrivals, ``max_wait_steps=2`` (at most 12 groups pending:
  arrivals beyond that wait in the producer).

The reference of a step: first-fit decreasing of the groups pending before it into the step's
4 micro-batches (each group into the first one with room, largest first; those that fit none
left out), its tokens. Columns: steps whose pending tokens exceed the step's capacity (the
steps the ratio is taken on; the others can take everything); the step's tokens over the
reference's, min and mean over those steps; the share of those steps under 0.95; the worst
wait of a group (steps from the step it arrived before to the step that took it); the median
planning time of a step (``next_step``, ms).

``--due-first`` measures the ``max_wait_steps`` scenarios against a second reference too:
first-fit decreasing with the groups whose wait is due placed first. That reference keeps the
deadlines of this step only; its last column counts the steps under 0.95 of it where its own
leftover could still meet every later deadline (a necessary condition: for every ``h``, the
groups due within the next ``h`` steps no more than ``h`` steps' micro-batches can hold, as many
per micro-batch as its smallest of them fit). Where it cannot, the reference broke a promise the
planner must keep, and the ratio is not a shortfall.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seqbal import StepPlanner  # noqa: E402

from .sft_epochs import length_lists  # noqa: E402

RANKS = 4
CAP = 4096
GROUP = 4
K = 1
SCENARIOS = {  # name: (arrivals, max_wait_steps)
    "steady": ("poisson", None),
    "outrun": ("backlog", None),
    "outrun, wait 20": ("backlog", 20),
    "steady, wait 2": ("poisson", 2),
}


def draw_groups(lengths: np.ndarray, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` groups of ``GROUP`` random samples of ``lengths``, each within the cap."""
    out: list[np.ndarray] = []
    while len(out) < count:
        group = lengths[rng.integers(0, len(lengths), GROUP)]
        if int(group.sum()) <= CAP:
            out.append(group)
    return out


def ffd_tokens(group_tokens: list[int], bins: int, capacity: int, first: Optional[list[int]] = None) -> int:
    """Tokens first-fit decreasing places into ``bins`` bins of ``capacity``; with ``first``,
    those groups' tokens are placed before the others (each part in decreasing size)."""
    sizes = list(first or []) + list(group_tokens)
    return sum(sizes[i] for i in ffd_choice(sizes, bins, capacity, len(first or [])))


def ffd_choice(sizes: list[int], bins: int, capacity: int, first: int = 0) -> list[int]:
    """Positions of ``sizes`` that first-fit decreasing places into ``bins`` bins of
    ``capacity``, the first ``first`` before the others (each part in decreasing size)."""
    loads = [0] * bins
    placed = []
    order = sorted(range(first), key=lambda i: -sizes[i]) + sorted(range(first, len(sizes)), key=lambda i: -sizes[i])
    for i in order:
        for b in range(bins):
            if loads[b] + sizes[i] <= capacity:
                loads[b] += sizes[i]
                placed.append(i)
                break
    return placed


def breaks_a_later_deadline(left: list[tuple[int, int]], bins: int, capacity: int) -> bool:
    """Whether groups left pending by this step (``(tokens, steps from this one to their
    deadline)``) provably cannot all leave by their deadlines: one is due in this step, or for
    some ``h``, the groups due within the next ``h`` steps outnumber what ``h`` steps of ``bins`` micro-batches can hold, counting
    per micro-batch the most of them that fit one (its smallest ones). A necessary condition
    of a schedule, so True is a proof and False is not."""
    for h in sorted({d for _, d in left if d >= 1}):
        due = sorted(t for t, d in left if d <= h)
        most, total = 0, 0
        for t in due:
            if total + t > capacity:
                break
            total, most = total + t, most + 1
        if len(due) > h * bins * max(most, 1):
            return True
    return any(d < 1 for _, d in left)


def simulate(lengths: np.ndarray, arrivals: str, wait: Optional[int], steps: int, seed: int,
             oldest_first: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    planner = StepPlanner(CAP, RANKS, micro_batches_per_step=K, max_wait_steps=wait, oldest_first=oldest_first)
    capacity = CAP * K * RANKS
    mean_groups = 0.9 * capacity / (GROUP * float(np.mean(lengths)))
    pending: dict[int, tuple[int, int]] = {}  # group id -> (tokens, step it arrived before)
    waiting: list[np.ndarray] = []  # the producer's groups not yet admitted
    limit = None if wait is None else (wait + 1) * K * RANKS
    next_id = 0
    ratios, due_ratios, waits, times = [], [], [], []
    reference_breaks_deadline: list[bool] = []  # per due ratio: the reference's leftover cannot meet its deadlines
    for step in range(steps):
        if arrivals == "poisson":
            waiting += draw_groups(lengths, int(rng.poisson(mean_groups)), rng)
        else:
            target = int(rng.integers(50, 91))
            waiting += draw_groups(lengths, max(0, target - len(pending) - len(waiting)), rng)
        while waiting and (limit is None or len(pending) < limit):
            group = waiting.pop(0)
            ids = list(range(next_id * GROUP, next_id * GROUP + GROUP))
            planner.add(ids, group.tolist(), groups=[next_id] * GROUP)
            pending[next_id] = (int(group.sum()), planner.steps)
            next_id += 1
        tokens = [t for t, _ in pending.values()]
        reference = ffd_tokens(tokens, K * RANKS, CAP)
        due_reference = 0
        if wait is not None:  # the due groups first; does the rest leave a later deadline out of reach?
            ordered = sorted(pending.values(), key=lambda g: planner.steps - g[1] < wait)
            first = sum(planner.steps - arrived >= wait for _, arrived in ordered)
            chosen = set(ffd_choice([t for t, _ in ordered], K * RANKS, CAP, first))
            due_reference = sum(ordered[i][0] for i in chosen)
            left = [(t, arrived + wait - planner.steps) for i, (t, arrived) in enumerate(ordered) if i not in chosen]
            reference_breaks = breaks_a_later_deadline(left, K * RANKS, CAP)
        start = time.perf_counter()
        planned = planner.next_step()
        times.append(time.perf_counter() - start)
        if planned is None:
            continue
        taken = {i // GROUP for rank in planned for mb in rank for i in mb}
        placed = sum(pending[g][0] for g in taken)
        if sum(tokens) > capacity:
            ratios.append(placed / reference)
            if wait is not None:
                due_ratios.append(placed / due_reference)
                reference_breaks_deadline.append(reference_breaks)
        for g in taken:
            waits.append(planner.steps - 1 - pending.pop(g)[1])
    return {"ratios": ratios, "due_ratios": due_ratios, "waits": waits, "times": times,
            "reference_breaks_deadline": reference_breaks_deadline}


def _cases(steps: int, seeds: int, oldest_first: bool = False, wait_only: bool = False):
    """``(list, scenario, pooled results of every seed)`` for every list and scenario."""
    lists = dict(length_lists())
    lists["uniform 1-1024"] = np.arange(1, CAP // GROUP + 1, dtype=np.int64)
    for name, lengths in lists.items():
        for scenario, (arrivals, wait) in SCENARIOS.items():
            if wait_only and wait is None:
                continue
            pooled: dict[str, list] = {}
            for seed in range(seeds):
                for key, values in simulate(lengths, arrivals, wait, steps, seed, oldest_first).items():
                    pooled.setdefault(key, []).extend(values)
            yield name, scenario, pooled


def _min_and_under(ratios: list[float]) -> tuple[str, str]:
    if not ratios:
        return "-", "-"
    return f"{min(ratios):.3f}", f"{sum(r < 0.95 for r in ratios) / len(ratios):.1%}"


def table(steps: int, seeds: int, oldest_first: bool = False) -> list[str]:
    out = ["| list | arrivals | steps over capacity | tokens / FFD's: min | mean | steps under 0.95 | "
           "worst wait (steps) | plan ms (median) |", "|---|---|---|---|---|---|---|---|"]
    for name, scenario, r in _cases(steps, seeds, oldest_first):
        ratios = r["ratios"]
        low, share = _min_and_under(ratios)
        mean = f"{statistics.mean(ratios):.3f}" if ratios else "-"
        out.append(f"| {name} | {scenario} | {len(ratios)} | {low} | {mean} | {share} | {max(r['waits'])} | "
                   f"{statistics.median(r['times']) * 1e3:.2f} |")
    return out


def due_table(steps: int, seeds: int) -> list[str]:
    """The scenarios with ``max_wait_steps`` against two references: first-fit decreasing of
    every pending group, and the same with the groups whose wait is due placed first (what any
    planner that keeps the deadline must take)."""
    out = ["| list | arrivals | steps over capacity | tokens / FFD's: min | under 0.95 | "
           "tokens / due-first FFD's: min | under 0.95 | of those, where the reference keeps every later deadline |",
           "|---|---|---|---|---|---|---|---|"]
    for name, scenario, r in _cases(steps, seeds, wait_only=True):
        cells = [*_min_and_under(r["ratios"]), *_min_and_under(r["due_ratios"])]
        under = [breaks for ratio, breaks in zip(r["due_ratios"], r["reference_breaks_deadline"]) if ratio < 0.95]
        cells.append(f"{sum(not b for b in under)} of {len(under)}" if r["due_ratios"] else "-")
        out.append(f"| {name} | {scenario} | {len(r['ratios'])} | " + " | ".join(cells) + " |")
    return out


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="runs per list and scenario")
    parser.add_argument("--smoke", action="store_true", help="seconds: 20 steps, one seed")
    parser.add_argument("--oldest-first", action="store_true", help="StepPlanner(oldest_first=True)")
    parser.add_argument("--due-first", action="store_true",
                        help="the max_wait_steps scenarios against FFD with the due groups placed first")
    args = parser.parse_args(argv)
    steps, seeds = (20, 1) if args.smoke else (args.steps, args.seeds)
    lines = due_table(steps, seeds) if args.due_first else table(steps, seeds, args.oldest_first)
    for line in lines:
        print(line, flush=True)


if __name__ == "__main__":
    main()
