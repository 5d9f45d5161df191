"""The token-budget sampler over several epochs, and at dataset scale.

Part 1, the mix (``python -m benchmarks.sft_epochs``): every real length list of
``../shared/data/lengths`` (and the shipped rollouts), caps 8192 and 16384, 8 ranks, 5 epochs,
for three routes:

- ``seqbal``: :class:`seqbal.epochs.sampler.TokenBudgetBatchSampler` (a fresh random
  partition every epoch at one count);
- ``plan once``: the sampler of commit 1a16c84: :func:`seqbal.build_dp_schedule` once, then
  every epoch permutes the slots and trades samples of equal length (re-implemented here);
- ``shuffle-fill``: shuffle the samples, fill micro-batches one after the other up to the cap
  (next fit), deal them to the ranks round-robin: the baseline of a fresh mix (its count changes
  every epoch, and ranks may get different counts).

Columns: micro-batches per rank (``a-b`` where it changes between epochs or ranks); the share of
micro-batches of epochs 1-4 whose set of samples is one of epoch 0's, of all and of those shared
by two or more samples (groups); the share whose multiset of lengths is one of epoch 0's; the
mean number of distinct partners a sample met over the 5 epochs, against shuffle-fill's; and the step balance,
the mean over slots of ``mean / max`` of the ranks' workloads (1.0 = no rank waits), per epoch
(min-max over the epochs). With ``--group 4``: forced groups of 4, and the share of groups that
met the very same partners in every epoch.

Part 2, scale (``--scale``): building the sampler (the count, its first epoch's plan, the
lengths' digest) and a later epoch's plan, at 10^6 samples, 8 and 64 ranks, caps 8192 and
32768, against one best-fit-decreasing pass (:func:`seqbal.best_fit_decreasing_partitions`) of
the same lengths in the same process (CPU time, median of ``--rounds`` interleaved rounds), and
peak memory (tracemalloc) against that pass's; ``pack_rows`` likewise; ``--n 10000000`` for the
10^7 row.

    python -m benchmarks.sft_epochs                       # the mix table
    python -m benchmarks.sft_epochs --group 4             # forced groups of 4
    python -m benchmarks.sft_epochs --scale --rounds 3    # the scale table
    python -m benchmarks.sft_epochs --smoke               # seconds, for tests/test_benchmark_smoke.py
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from importlib.resources import files
from typing import Callable

import numpy as np

from seqbal import best_fit_decreasing_partitions, build_dp_schedule, calculate_workload
from seqbal.epochs.sampler import TokenBudgetBatchSampler, pack_rows

from . import workloads
from .workloads import REAL_FILES, real_data_dir

Plan = list[list[list[int]]]  # [rank][slot] -> sample indices


def length_lists() -> dict[str, np.ndarray]:
    """The real lists where they are checked out, else the shipped rollouts alone."""
    directory = real_data_dir()
    if directory is None:
        text = files("seqbal").joinpath("data/qwen25math_cot_rollouts.txt").read_text()
        return {"qwen25math_cot_rollouts": np.array(text.split(), dtype=np.int64)}
    return {REAL_FILES[name].removesuffix(".txt"): workloads._load(name) for name in REAL_FILES}


#: Uniform lengths up to the cap (up to ``cap // group`` with forced groups): this many samples.
UNIFORM_SIZES = (2000, 10000)


def uniform_lists(cap: int, group: int) -> dict[str, np.ndarray]:
    """Uniform lengths in ``[1, cap // group]`` (a forced group then spans up to the cap), one list
    per size of :data:`UNIFORM_SIZES`, seeded by the size and the cap."""
    top = cap // group
    return {f"uniform 1-{top} x {n:,}": np.random.default_rng([n, cap]).integers(1, top + 1, n) for n in UNIFORM_SIZES}


def plan_once_route(lengths: np.ndarray, cap: int, world: int, group: int, epochs: int) -> list[Plan]:
    """The previous release's sampler: one schedule, then per epoch a slot permutation and a trade
    of equal-length groups."""
    schedule = build_dp_schedule(lengths.tolist(), world, cap, force_group_size=group, use_dynamic_bsz_balance=False)
    rows = lengths.reshape(-1, group)
    _, labels = np.unique(rows, axis=0, return_inverse=True)
    labels = labels.reshape(-1)
    plans = []
    for epoch in range(epochs):
        rng = np.random.default_rng([0, epoch])
        slots = rng.permutation(schedule.num_micro_batches)
        mapping = np.arange(len(labels))
        for value in np.unique(labels):
            members = np.flatnonzero(labels == value)
            if members.size > 1:
                mapping[members] = members[rng.permutation(members.size)]
        relabel = (mapping[:, None] * group + np.arange(group)).reshape(-1)
        plans.append([[sorted(relabel[list(rank[s])].tolist()) for s in slots] for rank in schedule.micro_batches])
    return plans


def shuffle_fill_route(lengths: np.ndarray, cap: int, world: int, group: int, epochs: int) -> list[Plan]:
    """Shuffle (forced groups whole), next fit up to the cap, deal round-robin to the ranks."""
    groups = len(lengths) // group
    costs = lengths.reshape(-1, group).sum(axis=1)
    plans = []
    for epoch in range(epochs):
        order = np.random.default_rng([1, epoch]).permutation(groups)
        bins, current, load = [], [], 0
        for g in order.tolist():
            if load + costs[g] > cap and current:
                bins.append(current)
                current, load = [], 0
            current.extend(range(g * group, g * group + group))
            load += int(costs[g])
        bins.append(current)
        plans.append([[sorted(b) for b in bins[r::world]] for r in range(world)])
    return plans


def seqbal_route(lengths: np.ndarray, cap: int, world: int, group: int, epochs: int) -> list[Plan]:
    sampler = TokenBudgetBatchSampler(lengths, cap, num_replicas=world, rank=0, force_group_size=group, seed=0)
    return [sampler.epoch_plan(epoch) for epoch in range(epochs)]


ROUTES: dict[str, Callable[..., list[Plan]]] = {
    "seqbal": seqbal_route, "plan once": plan_once_route, "shuffle-fill": shuffle_fill_route,
}


def repeated_sets(plans: list[Plan], shared_beyond: int = 0) -> float:
    """Share of the micro-batches of epochs 1.. whose set of samples is one of epoch 0's; with
    ``shared_beyond=g``, of those holding more than ``g`` samples only (more than one forced
    group of ``g``: a micro-batch of one sample or group is the same set wherever it recurs)."""
    first = {frozenset(mb) for rank in plans[0] for mb in rank}
    later = [frozenset(mb) for plan in plans[1:] for rank in plan for mb in rank if len(mb) > shared_beyond]
    return sum(m in first for m in later) / max(1, len(later))


def repeat_share(lengths: np.ndarray, plans: list[Plan]) -> float:
    """Share of the micro-batches of epochs 1.. whose length multiset is one of epoch 0's."""
    first = {tuple(sorted(lengths[mb].tolist())) for rank in plans[0] for mb in rank}
    later = [tuple(sorted(lengths[mb].tolist())) for plan in plans[1:] for rank in plan for mb in rank]
    return sum(m in first for m in later) / max(1, len(later))


def mean_partners(n: int, plans: list[Plan], group: int) -> float:
    """Mean over samples of the distinct other samples (outside its own forced group) it shared a
    micro-batch with, over all epochs."""
    met: list[set] = [set() for _ in range(n)]
    for plan in plans:
        for rank in plan:
            for mb in rank:
                members = set(mb)
                for i in mb:
                    met[i] |= members
    own = [set(range(i // group * group, i // group * group + group)) for i in range(n)]
    return float(np.mean([len(m - o) for m, o in zip(met, own)]))


def same_partner_groups(n: int, plans: list[Plan], group: int) -> float:
    """Share of forced groups whose micro-batch held the very same groups in every epoch."""
    seen: list[dict[int, frozenset]] = []
    for plan in plans:
        of = {}
        for rank in plan:
            for mb in rank:
                members = frozenset(i // group for i in mb)
                for g in members:
                    of[g] = members
        seen.append(of)
    return sum(all(s[g] == seen[0][g] for s in seen) for g in range(n // group)) / (n // group)


def step_balance(lengths: np.ndarray, plan: Plan) -> float:
    """Mean over slots of mean / max of the ranks' workloads (slots every rank has)."""
    work = calculate_workload(lengths)
    slots = min(len(rank) for rank in plan)
    ratios = []
    for s in range(slots):
        w = np.array([work[rank[s]].sum() for rank in plan], dtype=np.float64)
        ratios.append(w.mean() / w.max())
    return float(np.mean(ratios))


def counts(plans: list[Plan]) -> str:
    values = sorted({len(rank) for plan in plans for rank in plan})
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def mix_table(caps: list[int], world: int, epochs: int, group: int, limit: int = 0, uniform: bool = True,
              real: bool = True) -> str:
    head = ("| list | cap | route | per rank | repeats epoch 0's sample sets | of those shared | repeats epoch 0's mix | "
            "partners (vs shuffle-fill) | " + ("same partners every epoch | " if group > 1 else "")
            + "step balance per epoch |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    cases = [(name, lengths, cap) for name, lengths in length_lists().items() for cap in caps] if real else []
    if uniform:
        cases += [(name, lengths, cap) for cap in caps for name, lengths in uniform_lists(cap, group).items()]
    for name, lengths, cap in cases:
        if limit:
            lengths = lengths[:limit]
        lengths = lengths[: len(lengths) // group * group]
        results = {route: fn(lengths, cap, world, group, epochs) for route, fn in ROUTES.items()}
        partners = {route: mean_partners(len(lengths), plans, group) for route, plans in results.items()}
        for route, plans in results.items():
            balance = [step_balance(lengths, plan) for plan in plans]
            cells = [name, str(cap), route, counts(plans), f"{repeated_sets(plans):.1%}",
                     f"{repeated_sets(plans, shared_beyond=group):.1%}", f"{repeat_share(lengths, plans):.1%}",
                     f"{partners[route]:.0f} ({partners[route] / partners['shuffle-fill']:.2f})"]
            if group > 1:
                cells.append(f"{same_partner_groups(len(lengths), plans, group):.1%}")
            cells.append(f"{min(balance):.4f}-{max(balance):.4f}")
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _cpu(fn: Callable[[], object]) -> float:
    """CPU seconds of one call."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def _peak_mb(fn: Callable[[], object]) -> float:
    """tracemalloc's peak of one call, in MB (a separate call: tracing slows the interpreter)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak


def scale_rows(n: int, worlds: list[int], caps: list[int], rounds: int, family: str):
    """One table row per (cap, ranks), yielded as soon as it is measured."""
    yield (f"| family | n | ranks | cap | per rank | mix | BFD pass s | build s (BFD passes) | later epoch s "
           f"(passes) | pack_rows s (passes) | build peak MB (x BFD's) |")
    yield "|---|---|---|---|---|---|---|---|---|---|---|"
    for cap in caps:
        lengths, _ = workloads.SYNTHETIC[family](n, cap, workloads.case_seed(family, n, cap))
        for world in worlds:
            def build() -> TokenBudgetBatchSampler:
                return TokenBudgetBatchSampler(lengths, cap, num_replicas=world, rank=0, seed=0)

            bfd, built, later, pack = [], [], [], []
            sampler = None
            for _ in range(rounds):  # interleaved: the yardstick and the sampler in every round
                bfd.append(_cpu(lambda: best_fit_decreasing_partitions(lengths, cap)))
                holder = {}
                built.append(_cpu(lambda: holder.setdefault("s", build())))
                sampler = holder["s"]
                sampler.set_epoch(1)
                later.append(_cpu(lambda: list(sampler)))
                pack.append(_cpu(lambda: pack_rows(lengths, cap, num_replicas=world)))
            peak, bfd_peak = _peak_mb(build), _peak_mb(lambda: best_fit_decreasing_partitions(lengths, cap))
            b = statistics.median(bfd)
            yield (
                f"| {family} | {n:,} | {world} | {cap} | {len(sampler)} | {sampler.mix} | {b:.2f} | "
                f"{statistics.median(built):.2f} ({statistics.median(built) / b:.2f}) | "
                f"{statistics.median(later):.2f} ({statistics.median(later) / b:.2f}) | "
                f"{statistics.median(pack):.2f} ({statistics.median(pack) / b:.2f}) | "
                f"{peak:.0f} ({peak / bfd_peak:.2f}) |"
            )


def scale_table(n: int, worlds: list[int], caps: list[int], rounds: int, family: str) -> str:
    return "\n".join(scale_rows(n, worlds, caps, rounds, family))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=1, help="force_group_size (default 1)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--scale", action="store_true", help="the scale table instead of the mix table")
    parser.add_argument("--n", type=int, default=1_000_000, help="samples for --scale")
    parser.add_argument("--family", default="lognormal", help="length family for --scale (benchmarks/workloads.py)")
    parser.add_argument("--worlds", default="8,64")
    parser.add_argument("--caps", default=None, help="comma-separated caps (mix: 8192,16384; scale: 8192,32768)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--uniform-only", action="store_true", help="the mix table's uniform lists alone")
    parser.add_argument("--smoke", action="store_true", help="seconds: small slices of every table")
    args = parser.parse_args()
    if args.smoke:
        print(mix_table([4096], 2, 3, 1, limit=300))
        print(mix_table([8192], 2, 3, 2, limit=300, uniform=False))
        print(scale_table(20_000, [2], [8192], 1, "lognormal"))
        return
    if args.scale:
        caps = [int(c) for c in (args.caps or "8192,32768").split(",")]
        for row in scale_rows(args.n, [int(w) for w in args.worlds.split(",")], caps, args.rounds, args.family):
            print(row, flush=True)
    else:
        caps = [int(c) for c in (args.caps or "8192,16384").split(",")]
        print(mix_table(caps, args.world, args.epochs, args.group, real=not args.uniform_only))


if __name__ == "__main__":
    main()
