"""A simulated asynchronous RL run: rollouts arrive over time, a trainer takes a step when it can.

    python -m benchmarks.streams                 # the table of docs/benchmarks.md (60 steps, 8 ranks)
    python -m benchmarks.streams --ticks 20      # shorter
    python -m benchmarks.streams --cost          # a step's planning cost in best-fit-decreasing passes
    python -m benchmarks.streams --cost --draws 10   # the S step on 10 drawn pools per size

Arrivals: at every tick a Poisson number of GRPO groups finishes generating (whole groups of 8
drawn from the 100 real groups of seqbal/data/qwen25math_cot_rollouts.txt), about 90% of what
a step of ``K`` micro-batches on each of 8 ranks under the cap can hold. After the arrivals of a
tick, each method is asked for one step; a method that cannot make one waits for the next tick.
Every method sees the same arrivals, with the same sample ids (consecutive within a group).

Methods:

* ``StepPlanner (K)``: :class:`seqbal.StepPlanner` with ``micro_batches_per_step=K``, the
  GRPO group as its group (a group never split, also not across micro-batches), or every
  sample on its own (``samples``: a group may then span steps, as in LLaMA-Factory's streams;
  under the padded cost a group of 8 long samples does not fit one micro-batch).
* ``next-fit (K)``: groups in arrival order into the ``K x 8`` micro-batches, each closed when
  the next group does not fit; a step once all are opened; micro-batch ``b`` on rank ``b % 8``.
* ``TransferQueue + verl``: TransferQueue 0.1.11's own ``SeqlenBalancedSampler`` (whole groups,
  Karmarkar-Karp over ranks, a fixed batch of ``--tq-batch`` samples per rank), then verl's
  per-rank ``rearrange_micro_batches`` (verl 0.9.1's own where verl imports, else seqbal's
  line-for-line re-implementation; the table says which), counts agreed across ranks.
* ``LLaMA-Factory dynamic_batching``: LLaMA-Factory 0.9.5's own rule
  (``_get_dynamic_micro_batch_sizes``, padded budget ``cutoff_len x micro_batch_size``, exactly
  ``num_micro_batch`` micro-batches) on each rank's own stream (groups dealt to ranks in turn, as
  a sharded data loader does); a step once every rank has its micro-batches. Its padding-free
  sibling (``_get_dynamic_padding_free_micro_batch_sizes``) is measured too. These functions are
  read from the installed package's source and run alone (the module imports its trainer).
  ``dynamic_batching``'s budget is padded: the padded ``StepPlanner`` row is its counterpart.

Columns: steps taken in ``--ticks`` ticks; effective tokens per step; micro-batches per rank;
fill (effective tokens over ``ranks x micro-batches x cap``: everything else, padding inside a
micro-batch or capacity left empty, is padding to the fixed count); micro-batches over the cap
(under the method's own cost); the worst and mean wait of a sample (ticks from its arrival to
its step); step balance per micro-batch (the summed workload over ``ranks x`` the sum of every
slot's heaviest micro-batch: 1.0 when every slot is even; FSDP waits at every micro-batch) and
per step (over ``ranks x`` the heaviest rank total); the median planning time per step; samples
still pending at the end. Workloads are seqbal's default model (``24576 s + s^2``).

TransferQueue and LLaMA-Factory are installed without their dependencies for this
(``pip install --no-deps TransferQueue==0.1.11 llamafactory==0.9.5``); their rows are skipped
where they are absent. Planning times on a shared machine are noisy: read them as ratios
within one run.
"""

from __future__ import annotations

import argparse
import ast
import gc
import importlib.util
import statistics
import sys
import time
import types
from importlib.resources import files
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seqbal import CostModel, StepPlanner, best_fit_decreasing_partitions, calculate_workload  # noqa: E402

RANKS = 8
GROUP = 8
CAP = 16384
K = 2
#: LLaMA-Factory's budget: cutoff_len x micro_batch_size = CAP, no sample truncated (longest 3214).
CUTOFF_LEN = 4096
MICRO_BATCH_SIZE = CAP // CUTOFF_LEN


def real_groups() -> list[np.ndarray]:
    lengths = np.loadtxt(str(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt"), dtype=np.int64)
    return [lengths[i:i + GROUP] for i in range(0, len(lengths), GROUP)]


def arrivals(ticks: int, mean_groups: float, seed: int) -> list[list[np.ndarray]]:
    """Per tick, the groups (their lengths) that finish generating."""
    groups = real_groups()
    rng = np.random.default_rng(seed)
    return [[groups[g] for g in rng.integers(0, len(groups), rng.poisson(mean_groups))] for _ in range(ticks)]


# ---------------------------------------------------------------------------------------------
# Peers' own code
# ---------------------------------------------------------------------------------------------


def transfer_queue_sampler() -> Optional[type]:
    """TransferQueue 0.1.11's ``SeqlenBalancedSampler``, its sampler modules loaded without the
    package's ``__init__`` (which starts its Ray/ZMQ client stack and needs its dependencies)."""
    spec = importlib.util.find_spec("transfer_queue")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    for name, path in (("transfer_queue", root), ("transfer_queue.sampler", root / "sampler")):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(path)]
            sys.modules[name] = module
    base = importlib.import_module("transfer_queue.sampler.base")
    sys.modules["transfer_queue.sampler"].BaseSampler = base.BaseSampler
    return importlib.import_module("transfer_queue.sampler.seqlen_balanced_sampler").SeqlenBalancedSampler


def llamafactory_rules() -> Optional[dict[str, Callable]]:
    """LLaMA-Factory 0.9.5's two dynamic rules, their source read from the installed package
    and run alone (the module itself imports torch and its trainer's utilities)."""
    spec = importlib.util.find_spec("llamafactory")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "v1" / "plugins" / "trainer_plugins" / "batching.py"
    tree = ast.parse(path.read_text())
    wanted = {"_get_dynamic_micro_batch_sizes", "_get_dynamic_padding_free_micro_batch_sizes"}
    body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    namespace: dict[str, Any] = {"ModelInput": dict, "BatchInfo": dict}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102 - their code
    return {name: namespace[name] for name in wanted}


def verl_split() -> tuple[Callable, str]:
    """verl's per-rank ``rearrange_micro_batches`` with the counts agreed across ranks: verl's
    own where it imports, else seqbal's re-implementation of it."""
    from seqbal.cli.verl_run import load_verl, reimplemented_strict_loop, verl_strict_loop

    code = load_verl()
    if code.module is not None:
        return (lambda rank_lengths: verl_strict_loop(code, rank_lengths, CAP).parts), f"verl {code.version}"
    return (lambda rank_lengths: reimplemented_strict_loop(rank_lengths, CAP).parts), "verl re-implemented"


# ---------------------------------------------------------------------------------------------
# Methods: each gets the arrivals of a tick and returns a step [rank][micro-batch] of ids, or None
# ---------------------------------------------------------------------------------------------


class Planner:
    def __init__(self, cost_model: Any = None, groups: bool = True) -> None:
        self.planner = StepPlanner(CAP, RANKS, micro_batches_per_step=K, cost_model=cost_model)
        self.groups = groups

    def tick(self, ids: list[np.ndarray], lengths: list[np.ndarray], uids: list[int]) -> Optional[list]:
        if ids:
            groups = np.repeat(uids, [len(i) for i in ids]).tolist() if self.groups else None
            self.planner.add(np.concatenate(ids), np.concatenate(lengths), groups=groups)
        return self.planner.next_step()


class NextFit:
    def __init__(self) -> None:
        self.pool: list[tuple[np.ndarray, np.ndarray]] = []

    def tick(self, ids, lengths, uids):
        self.pool.extend(zip(ids, lengths))
        bins: list[list[int]] = [[]]
        load, used = 0, 0
        for group_ids, group_lengths in self.pool:
            size = int(group_lengths.sum())
            if load + size > CAP:
                if len(bins) == K * RANKS:
                    break
                bins.append([])
                load = 0
            bins[-1].extend(group_ids.tolist())
            load += size
            used += 1
        else:
            return None  # the pool ran out before every micro-batch was opened and closed
        self.pool = self.pool[used:]
        return [[sorted(bins[s * RANKS + r]) for s in range(K)] for r in range(RANKS)]


class TransferQueueVerl:
    def __init__(self, sampler_class: type, split: Callable, batch: int) -> None:
        self.sampler = sampler_class(n_samples_per_prompt=GROUP, dp_size=RANKS)
        self.split = split
        self.batch = batch
        self.ready: list[int] = []
        self.length: dict[int, int] = {}
        self.step = 0
        outer = self

        class Partition:  # what the controller hands the sampler: per-sample custom_meta
            def get_custom_meta(self, indexes):
                return {i: {"total_lengths": outer.length[i]} for i in indexes}

        self.partition = Partition()

    def tick(self, ids, lengths, uids):
        for group_ids, group_lengths in zip(ids, lengths):
            self.ready.extend(group_ids.tolist())
            self.length.update(zip(group_ids.tolist(), group_lengths.tolist()))
        shares = [self.sampler.sample(self.ready, self.batch, task_name="train", partition_id="p", dp_rank=r,
                                      batch_index=self.step, partition=self.partition)[0] for r in range(RANKS)]
        if not shares[0]:
            return None
        self.step += 1
        taken = {i for share in shares for i in share}
        self.ready = [i for i in self.ready if i not in taken]
        rank_lengths = [np.array([self.length[i] for i in share], dtype=np.int64) for share in shares]
        parts = self.split(rank_lengths)
        return [[sorted(share[i] for i in part) for part in rank_parts] for share, rank_parts in zip(shares, parts)]


class LlamaFactory:
    def __init__(self, rule: Callable) -> None:
        self.rule = rule
        self.buffers: list[list[dict]] = [[] for _ in range(RANKS)]
        self.dealt = 0
        self.info = {"cutoff_len": CUTOFF_LEN, "micro_batch_size": MICRO_BATCH_SIZE, "num_micro_batch": K}

    def tick(self, ids, lengths, uids):
        for group_ids, group_lengths in zip(ids, lengths):  # a group to each rank's stream in turn
            buffer = self.buffers[self.dealt % RANKS]
            self.dealt += 1
            buffer.extend({"id": i, "input_ids": range(n)} for i, n in zip(group_ids.tolist(), group_lengths.tolist()))
        sizes = [self.rule(buffer, self.info) for buffer in self.buffers]
        if any(len(s) < K for s in sizes):
            return None  # LLaMA-Factory's fill_buffer would block this rank until it has them
        step = []
        for r, rank_sizes in enumerate(sizes):
            rank, start = [], 0
            for n in rank_sizes:
                rank.append(sorted(s["id"] for s in self.buffers[r][start:start + n]))
                start += n
            self.buffers[r] = self.buffers[r][start:]
            step.append(rank)
        return step


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def simulate(method: Any, ticks: list[list[np.ndarray]], model: CostModel) -> dict:
    next_id, uid = 0, 0
    length, born = {}, {}
    steps, times, waits = [], [], []
    for t, groups in enumerate(ticks):
        ids, lengths, uids = [], [], []
        for group_lengths in groups:
            group_ids = np.arange(next_id, next_id + len(group_lengths))
            next_id += len(group_lengths)
            ids.append(group_ids)
            lengths.append(group_lengths)
            uids.append(uid)
            uid += 1
            for i, n in zip(group_ids.tolist(), group_lengths.tolist()):
                length[i], born[i] = n, t
        gc.collect()
        start = time.perf_counter()
        step = method.tick(ids, lengths, uids)
        times.append(time.perf_counter() - start)
        if step is not None:
            steps.append(step)
            waits.extend(t - born[i] for rank in step for mb in rank for i in mb)
    emitted = [i for step in steps for rank in step for mb in rank for i in mb]
    if len(emitted) != len(set(emitted)):
        raise AssertionError("a sample emitted twice")
    tokens, fills, over, per_mb, per_step, counts = [], [], 0, [], [], []
    for step in steps:
        count = len(step[0])
        counts.append(count)
        work = np.zeros((RANKS, count))
        total = 0
        for r, rank in enumerate(step):
            if len(rank) != count:
                raise AssertionError("ranks with different counts")
            for m, mb in enumerate(rank):
                lens = [length[i] for i in mb]
                total += sum(lens)
                over += model.cost(lens) > CAP
                work[r, m] = int(np.sum(calculate_workload(lens))) if lens else 0
        tokens.append(total)
        fills.append(total / (RANKS * count * CAP))
        per_mb.append(work.sum() / (RANKS * work.max(axis=0).sum()))
        per_step.append(work.sum() / (RANKS * work.sum(axis=1).max()))
    return {
        "steps": len(steps), "tokens": statistics.mean(tokens) if tokens else 0,
        "count": f"{min(counts)}-{max(counts)}" if counts and min(counts) != max(counts) else str(counts[0] if counts else "-"),
        "fill": statistics.mean(fills) if fills else 0, "over": over,
        "worst_wait": max(waits) if waits else 0, "mean_wait": statistics.mean(waits) if waits else 0,
        "per_mb": statistics.mean(per_mb) if per_mb else 0, "per_step": statistics.mean(per_step) if per_step else 0,
        "ms": 1e3 * statistics.median(times), "pending": next_id - len(emitted),
    }


def table(ticks: int, seed: int, tq_batch: int) -> list[str]:
    groups = real_groups()
    mean_len = float(np.mean([g.sum() for g in groups]))
    mean_groups = 0.9 * K * RANKS * CAP / mean_len
    stream = arrivals(ticks, mean_groups, seed)
    rows = [("StepPlanner (K), GRPO groups whole", "tokens", lambda: Planner(), CostModel()),
            ("StepPlanner (K), samples", "tokens", lambda: Planner(groups=False), CostModel()),
            ("StepPlanner (K), samples", "padded", lambda: Planner("padded", groups=False), CostModel(padded=True)),
            ("next-fit (K)", "tokens", NextFit, CostModel())]
    sampler = transfer_queue_sampler()
    if sampler is not None:
        split, which = verl_split()
        rows.append((f"TransferQueue 0.1.11 SeqlenBalancedSampler + {which}", "tokens",
                     lambda: TransferQueueVerl(sampler, split, tq_batch), CostModel()))
    rules = llamafactory_rules()
    if rules is not None:
        rows.append(("LLaMA-Factory 0.9.5 dynamic_batching", "padded",
                     lambda: LlamaFactory(rules["_get_dynamic_micro_batch_sizes"]), CostModel(padded=True)))
        rows.append(("LLaMA-Factory 0.9.5 dynamic_padding_free", "tokens",
                     lambda: LlamaFactory(rules["_get_dynamic_padding_free_micro_batch_sizes"]), CostModel()))
    out = [f"{ticks} ticks, {RANKS} ranks, GRPO groups of {GROUP}, cap {CAP}, K = {K} micro-batches per rank "
           f"(TransferQueue: {tq_batch} samples per rank), {mean_groups:.1f} groups arriving per tick on average",
           "",
           "| method | cost | steps | tokens per step | micro-batches per rank | fill | over cap | worst wait | "
           "mean wait | balance per micro-batch | per step | planning ms (median) | pending at end |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, cost, make, model in rows:
        r = simulate(make(), stream, model)
        out.append(f"| {name} | {cost} | {r['steps']} | {r['tokens']:,.0f} | {r['count']} | {r['fill']:.3f} | "
                   f"{r['over']} | {r['worst_wait']} | {r['mean_wait']:.2f} | {r['per_mb']:.3f} | {r['per_step']:.3f} | "
                   f"{r['ms']:.2f} | {r['pending']:,} |")
    return out


def _scheduled(planner: StepPlanner) -> StepPlanner:
    """``planner`` with every ``S`` step planned by ``build_dp_schedule`` on the chosen samples
    (the planner's own route before it tried the count at the lower bound first)."""
    planner._at_lower_bound = lambda chosen: None
    return planner


def _step_figures(step: Optional[list[list[list[int]]]], lengths: np.ndarray) -> Optional[tuple[int, float, float]]:
    """(micro-batches per rank, balance per micro-batch, balance per step) of one step, on
    seqbal's default workloads (as the run's table); None for no step."""
    if step is None:
        return None
    work = calculate_workload(lengths)
    cells = np.array([[int(work[mb].sum()) for mb in rank] for rank in step])  # [rank, slot]
    total = cells.sum()
    return cells.shape[1], total / (len(step) * cells.max(axis=0).sum()), total / (len(step) * cells.sum(axis=1).max())


def cost_table(pools: list[int], rounds: int) -> list[str]:
    """One step's planning CPU time against one BFD pass over the same pool's lengths, interleaved
    rounds, medians (``python -m benchmarks.streams --cost``). ``S = 512`` is measured twice, as
    it plans now and forced onto ``build_dp_schedule`` (its route before), side by side, with
    the count and the balance of each one's step."""
    modes = [("K = 2 x 8 ranks", dict(micro_batches_per_step=K), False),
             ("K = 8 x 8 ranks", dict(micro_batches_per_step=8), False),
             ("S = 512", dict(samples_per_step=512), False),
             ("S = 512 by build_dp_schedule", dict(samples_per_step=512), True)]
    ratios: dict[tuple[int, str], list[float]] = {}
    step_ms: dict[tuple[int, str], list[float]] = {}
    figures: dict[tuple[int, str], tuple[int, float, float]] = {}
    bfd_ms: dict[int, list[float]] = {}
    rng = np.random.default_rng(0)
    cases = {n: np.concatenate([real_groups()[g] for g in rng.integers(0, 100, n // GROUP)]) for n in pools}
    for _ in range(rounds):
        for n in pools:
            pool = cases[n]
            gc.collect()
            start = time.process_time()
            best_fit_decreasing_partitions(pool, CAP)
            bfd = time.process_time() - start
            bfd_ms.setdefault(n, []).append(bfd * 1e3)
            for name, kwargs, before in modes:
                planner = StepPlanner(CAP, RANKS, **kwargs)
                if before:
                    _scheduled(planner)
                planner.add(np.arange(len(pool)), pool, groups=(np.arange(len(pool)) // GROUP).tolist())
                planner._pool.consolidate()  # the pool as it stands before a step (joined once per step anyway)
                gc.collect()
                start = time.process_time()
                step = planner.next_step()
                seconds = time.process_time() - start
                ratios.setdefault((n, name), []).append(seconds / max(bfd, 1e-9))
                step_ms.setdefault((n, name), []).append(seconds * 1e3)
                figures[(n, name)] = _step_figures(step, pool)  # deterministic: the same every round
    out = ["| pool (samples) | BFD pass ms | " + " | ".join(f"{name}: ms / BFD passes" for name, _, _ in modes) + " |",
           "|---|---|" + "---|" * len(modes)]
    for n in pools:
        cells = [f"{statistics.median(step_ms[(n, name)]):.1f} / {statistics.median(ratios[(n, name)]):.2f}"
                 for name, _, _ in modes]
        out.append(f"| {n:,} | {statistics.median(bfd_ms[n]):.1f} | " + " | ".join(cells) + " |")
    out += ["", "| pool (samples) | " + " | ".join(
        f"{name}: micro-batches per rank / balance per micro-batch / per step" for name, _, _ in modes) + " |",
        "|---|" + "---|" * len(modes)]
    for n in pools:
        out.append(f"| {n:,} | " + " | ".join(
            "no step" if figures[(n, name)] is None else "{} / {:.4f} / {:.4f}".format(*figures[(n, name)])
            for name, _, _ in modes) + " |")
    return out


def draws_table(pools: list[int], draws: int, rounds: int) -> list[str]:
    """The ``S = 512`` step, as planned and by ``build_dp_schedule``, on ``draws`` pools per size
    (groups drawn with seeds 0, 1, ...): the range over the draws of the BFD passes (medians of
    ``rounds``), of the micro-batches per rank and of the balance per micro-batch
    (``python -m benchmarks.streams --cost --draws 10``)."""
    groups = real_groups()
    out = ["| pool (samples) | BFD passes | by build_dp_schedule | the same micro-batches per rank | "
           "balance per micro-batch | by build_dp_schedule | worst ratio of the two |",
           "|---|---|---|---|---|---|---|"]
    for n in pools:
        found: dict[bool, list[tuple[float, int, float]]] = {False: [], True: []}
        for seed in range(draws):
            rng = np.random.default_rng(seed)
            pool = np.concatenate([groups[g] for g in rng.integers(0, 100, n // GROUP)])
            times: dict[bool, list[float]] = {False: [], True: []}
            figures = {}
            for _ in range(rounds):
                gc.collect()
                start = time.process_time()
                best_fit_decreasing_partitions(pool, CAP)
                bfd = max(time.process_time() - start, 1e-9)
                for before in (False, True):
                    planner = StepPlanner(CAP, RANKS, samples_per_step=512)
                    if before:
                        _scheduled(planner)
                    planner.add(np.arange(len(pool)), pool, groups=(np.arange(len(pool)) // GROUP).tolist())
                    planner._pool.consolidate()
                    gc.collect()
                    start = time.process_time()
                    step = planner.next_step()
                    times[before].append((time.process_time() - start) / bfd)
                    figures[before] = _step_figures(step, pool)
            for before in (False, True):
                count, balance, _ = figures[before]
                found[before].append((statistics.median(times[before]), count, balance))
        now, then = found[False], found[True]
        same = sum(a[1] == b[1] for a, b in zip(now, then))
        worst = min(a[2] / b[2] for a, b in zip(now, then))

        def span(rows: list[tuple[float, int, float]], i: int, digits: int) -> str:
            return f"{min(r[i] for r in rows):.{digits}f} to {max(r[i] for r in rows):.{digits}f}"

        out.append(f"| {n:,} | {span(now, 0, 2)} | {span(then, 0, 2)} | {same} of {draws} | {span(now, 2, 4)} | "
                   f"{span(then, 2, 4)} | {worst:.4f} |")
    return out


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tq-batch", type=int, default=64, help="TransferQueue's per-rank batch (samples)")
    parser.add_argument("--cost", action="store_true", help="the planning cost in BFD passes instead")
    parser.add_argument("--pools", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--draws", type=int, default=0,
                        help="with --cost: the S step on this many drawn pools per size instead")
    args = parser.parse_args(argv)
    if args.cost and args.draws:
        lines = draws_table(args.pools, args.draws, args.rounds)
    else:
        lines = cost_table(args.pools, args.rounds) if args.cost else table(args.ticks, args.seed, args.tq_batch)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
