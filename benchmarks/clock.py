"""The clock benchmark: every planner's micro-batches run on a real model and timed.

    python -m benchmarks.clock --jobs 2    # the grid below (about an hour on 2 loaded cores)
    python -m benchmarks.clock --quick     # a minute: one model, one list, 4 ranks, one cap
    python -m benchmarks.clock --json out.json   # also every row, for the docs' tables

Other benchmarks score a plan on a cost formula (a proxy). Here each plan's micro-batches run
forward and backward on a tiny Llama-shaped transformer (``benchmarks/tiny_lm.py``, SwiGLU MLP,
packed sequences with attention per sequence as varlen kernels run it) and are timed: on the CPU
the thread's CPU time with torch on one thread (what the step costs, not what other jobs on the
machine take), on CUDA with events. With ``t[r][i]`` the time of rank ``r``'s ``i``-th
micro-batch:

* per micro-batch sync (FSDP gathers parameters in every micro-batch): ``sum t / (ranks * sum_i
  max_r t[r][i])``;
* per step sync (DDP's one all-reduce): ``mean_r T_r / max_r T_r`` with ``T_r = sum_i t[r][i]``.

Each micro-batch's time is the best of ``--repeats`` timings; every repeat runs the planners in
a fresh random order, so a load change on the machine hits every row alike. Each row also
reports the same two figures on seqbal's default workload ``24576*s + s**2`` (its proxy), so the
gap between what a planner balances and what the clock says is visible. The noise column is the
spread (max - min) of a row's efficiency computed from each repeat alone: the best-of-repeats
figure moves less than that between runs.

Rows (all on the same global batch of each case):

* ``seqbal default``: ``build_dp_schedule(lengths, ranks, cap)`` (the default workload);
* ``seqbal tokens``: the same with ``workload_fn`` = the lengths;
* ``seqbal workload_from_config``: with ``seqbal.workload_from_config(model config)``;
* ``seqbal calibrate``: ``seqbal.timing.fastest_schedule(lengths, ranks, cap, cal)`` with ``cal =
  seqbal.timing.calibrate(step, lengths=the list, max_token_len=cap)`` (probes timed on the model
  itself, once per model, list and cap): ``build_dp_schedule`` on its ``workload_fn``, at the
  fewest count or up to 2 more micro-batches per rank where the model predicts a faster step;
* ``seqbal recorder``: the same with ``seqbal.timing.Recorder().fit()`` after ``--recorder-steps``
  steps of the same run (other batches of the list, planned on the default workload, each
  micro-batch timed once as a trainer records it);
* ``verl 0.9.1``: its own ``get_seqlen_balanced_partitions`` on ``calculate_workload`` (as
  ``RayPPOTrainer._balance_batch`` calls it, each share ordered by workload), then its own
  ``rearrange_micro_batches`` on every rank in lock-step (re-run at the largest count until all
  agree, as its all-reduces do);
* ``transformers BatchRebalanceSampler``: transformers' own sampler (>= 5.24) with
  ``effective_batch_size`` = the batch, ``grad_accum`` = seqbal's count per rank, no shuffle; it
  has no token cap (its cost is padded ``bs * L + 0.001 * bs * L**2``), so its largest
  micro-batch over the cap is reported;
* ``prime-rl packer``: ``benchmarks/prime_rl_packer.py``, a re-implementation at the named commit
  with its FLOP cost from the same config.

Rows whose API is missing (``seqbal.timing``, ``workload_from_config``, verl, transformers < 5.24)
are left out with a note. Grid: three real length lists (the shipped Qwen2.5-Math rollouts,
MATH test solutions, AlpacaEval outputs; clipped to the cap), 4 and 8 ranks, caps 1024 and 2048,
a global batch of about ``--micro-batches`` (3) cap-sized micro-batches per rank, three models:
hidden 64 with SDPA, hidden 32 with eager and with SDPA attention (two layers, SwiGLU, vocabulary
512; ``--models`` picks others, ``h64 eager`` included).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

if __package__ in (None, ""):  # allow `python benchmarks/clock.py` too
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import prime_rl_packer  # noqa: E402
from benchmarks.step_time import length_files, lockstep  # noqa: E402
from seqbal import build_dp_schedule, calculate_workload  # noqa: E402

SEED = 20261207
LISTS = ("qwen25math_cot_rollouts.txt", "math_test.txt", "alpaca_eval_outputs.txt")
RANKS = (4, 8)
CAPS = (1024, 2048)
VOCAB = 512
SIZES = {"h32": dict(hidden=32, heads=2, layers=2, intermediate=88),
         "h64": dict(hidden=64, heads=2, layers=2, intermediate=176),
         "h256": dict(hidden=256, heads=4, layers=4, intermediate=688)}  # on request: a step of tenths of a second
ATTENTION = ("eager", "sdpa")
MODELS = ("h64 sdpa", "h32 eager", "h32 sdpa")  # two sizes, both attention kinds; "h64 eager" on request

RankParts = list[list[list[int]]]  # per rank, per micro-batch (run order), global sample indices
ROWS = ("seqbal default", "seqbal tokens", "seqbal workload_from_config", "seqbal calibrate", "seqbal recorder",
        "verl 0.9.1", "transformers BatchRebalanceSampler", "prime-rl packer")
CALIBRATED = ("seqbal calibrate", "seqbal recorder")
CONTROL = "control: rank 0's micro-batches on every rank"  # true efficiency 1: the clock's own floor


# ---------------------------------------------------------------------------------------------
# The model and its clock
# ---------------------------------------------------------------------------------------------


@dataclass
class Model:
    """One tiny model: its step ``step(lengths)``, its Llama-shaped config dict, its device."""

    name: str
    step: Callable[[Sequence[int]], None]
    config: dict
    device: str


def make_model(size: str, attention: str, device: str, packing: str = "split") -> Model:
    """``packing="split"`` (default) cuts each sequence's attention window out of the packed
    tokens as a varlen kernel does (cost grows with each sequence's own length);
    ``"slices"`` indexes a window per sequence, whose backward adds a zero gradient the size of
    the whole micro-batch per sequence (``benchmarks/tiny_lm.py``), a cost no varlen kernel has."""
    import torch

    from benchmarks.tiny_lm import TinyLM, llama_config, make_step

    shape = SIZES[size]
    torch.manual_seed(SEED)
    model = TinyLM(vocab=VOCAB, attention=attention, mlp="gated", packing=packing, **shape).to(device)
    return Model(f"{size} {attention}", make_step(model, device), llama_config(VOCAB, **shape), device)


def time_once(model: Model, lengths: Sequence[int]) -> float:
    """Seconds of one step: CUDA events on a GPU, else the calling thread's CPU time."""
    if model.device.startswith("cuda"):
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model.step(lengths)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.thread_time()
    model.step(lengths)
    return time.thread_time() - begin


# ---------------------------------------------------------------------------------------------
# Batches and planners
# ---------------------------------------------------------------------------------------------


def list_lengths(name: str, cap: int) -> np.ndarray:
    return np.minimum(np.loadtxt(length_files()[name], dtype=np.int64), cap)


def global_batch(data: np.ndarray, ranks: int, cap: int, micro_batches: int, seed: int) -> np.ndarray:
    """About ``micro_batches`` cap-sized micro-batches per rank of the list, shuffled (seeded);
    the sample count a multiple of ``ranks``."""
    n = max(ranks, int(round(micro_batches * cap * ranks / data.mean() / ranks)) * ranks)
    rng = np.random.default_rng([SEED, seed, ranks, cap])
    order = np.concatenate([rng.permutation(len(data)) for _ in range(-(-n // len(data)))])[:n]
    return data[order]


def schedule_route(lengths: np.ndarray, ranks: int, cap: int, workload_fn=None) -> RankParts:
    schedule = build_dp_schedule(lengths, ranks, cap, workload_fn=workload_fn)
    return [[list(mb) for mb in rank] for rank in schedule.micro_batches]


def fastest_route(lengths: np.ndarray, ranks: int, cap: int, calibration) -> RankParts:
    """The calibrated route: ``fastest_schedule`` (the count of least predicted step seconds)."""
    from seqbal.timing import fastest_schedule

    schedule = fastest_schedule(lengths, ranks, cap, calibration)
    return [[list(mb) for mb in rank] for rank in schedule.micro_batches]


def verl_route(lengths: np.ndarray, ranks: int, cap: int) -> RankParts:
    """verl 0.9.1's own driver balance and strict per-rank loop (its functions, imported)."""
    import torch
    from tensordict import TensorDict
    from verl.utils import seqlen_balancing as verl

    work = verl.calculate_workload(torch.as_tensor(lengths))
    shares = verl.get_seqlen_balanced_partitions(work, k_partitions=ranks, equal_size=True)
    shares = [sorted(p, key=lambda i: (int(work[i]), i)) for p in shares]  # as _balance_batch orders them

    def plan(share: np.ndarray, count: Optional[int]) -> list[list[int]]:
        values = torch.as_tensor(lengths[share])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), values.cumsum(0)])
        ids = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1]), dtype=torch.long), offsets)
        batch = TensorDict({"input_ids": ids}, batch_size=[len(share)])
        return verl.rearrange_micro_batches(batch, cap, min_num_micro_batch=count)[1]

    return lockstep(plan, shares)


def transformers_route(lengths: np.ndarray, ranks: int, count: int) -> RankParts:
    """transformers' own ``BatchRebalanceSampler``: every rank's ``count`` micro-batches."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    return [list(BatchRebalanceSampler(lengths.tolist(), effective_batch_size=len(lengths), dp_size=ranks,
                                       grad_accum=count, shuffle=False, rank=r)) for r in range(ranks)]


def have(row: str) -> Optional[str]:
    """None if the row can run here, else why not."""
    import importlib.util

    if row in CALIBRATED:
        try:
            import seqbal.timing  # noqa: F401
        except ImportError:
            return "seqbal.timing is not in this seqbal"
    if row == "seqbal workload_from_config":
        import seqbal

        if not hasattr(seqbal, "workload_from_config"):
            return "seqbal.workload_from_config is not in this seqbal"
    if row == "verl 0.9.1":
        try:
            from verl.utils import seqlen_balancing  # noqa: F401
        except Exception as error:  # noqa: BLE001 - verl absent or broken here
            return f"verl cannot be imported ({type(error).__name__}: {error})"
    if row == "transformers BatchRebalanceSampler":
        if importlib.util.find_spec("transformers") is None:
            return "transformers is not installed"
        from transformers import trainer_pt_utils, __version__

        if not hasattr(trainer_pt_utils, "BatchRebalanceSampler"):
            return f"transformers {__version__} has no BatchRebalanceSampler (added in 5.24.0)"
    return None


# ---------------------------------------------------------------------------------------------
# Efficiency
# ---------------------------------------------------------------------------------------------


def efficiency(grid: Sequence[Sequence[float]]) -> tuple[float, float]:
    """``(per micro-batch sync, per step sync)`` efficiency of per-rank, per-micro-batch costs;
    a rank with fewer micro-batches waits at the others' extra syncs (its missing ones cost 0)."""
    width = max(len(rank) for rank in grid)
    t = np.array([list(rank) + [0.0] * (width - len(rank)) for rank in grid], dtype=np.float64)
    totals = t.sum(axis=1)
    return float(t.sum() / (len(t) * t.max(axis=0).sum())), float(totals.mean() / totals.max())


def proxy_grid(lengths: np.ndarray, parts: RankParts) -> list[list[float]]:
    work = calculate_workload(lengths)
    return [[float(work[mb].sum()) for mb in rank] for rank in parts]


# ---------------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    list_name: str
    ranks: int
    cap: int


@dataclass
class Context:
    """What a model carries from case to case: calibrations by (list, cap), notes."""

    calibrations: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def time_plans(model: Model, lengths: np.ndarray, plans: dict[str, RankParts], repeats: int,
               rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``[repeat, rank, micro-batch]`` seconds of every plan, planners interleaved per repeat."""
    out = {name: np.zeros((repeats, len(p), max(len(r) for r in p))) for name, p in plans.items()}
    names = list(plans)
    for repeat in range(repeats):
        for name in rng.permutation(names):
            for r, rank in enumerate(plans[name]):
                for i, mb in enumerate(rank):
                    if mb:
                        out[name][repeat, r, i] = time_once(model, lengths[mb].tolist())
    return out


def recorder_fit(model: Model, data: np.ndarray, case: Case, steps: int, micro_batches: int):
    from seqbal.timing import Recorder

    recorder = Recorder()
    for s in range(steps):
        batch = global_batch(data, case.ranks, case.cap, micro_batches, seed=1000 + s)
        for rank in schedule_route(batch, case.ranks, case.cap):
            for mb in rank:
                recorder.record(batch[mb].tolist(), time_once(model, batch[mb].tolist()))
    return recorder.fit()


def plans_for(model: Model, case: Case, lengths: np.ndarray, data: np.ndarray, context: Context,
              args: argparse.Namespace) -> tuple[dict[str, RankParts], dict[str, float]]:
    """Every available row's plan of ``lengths``, and each row's planning seconds."""
    import seqbal

    plans: dict[str, RankParts] = {}
    seconds: dict[str, float] = {}

    def add(row: str, make: Callable[[], RankParts]) -> None:
        reason = have(row)
        if reason is not None:
            note = f"{row}: left out, {reason}"
            if note not in context.notes:
                context.notes.append(note)
            return
        start = time.perf_counter()
        plans[row] = make()
        seconds[row] = time.perf_counter() - start

    add("seqbal default", lambda: schedule_route(lengths, case.ranks, case.cap))
    add("seqbal tokens", lambda: schedule_route(lengths, case.ranks, case.cap, lambda a: np.asarray(a, dtype=np.int64)))
    add("seqbal workload_from_config",
        lambda: schedule_route(lengths, case.ranks, case.cap, seqbal.workload_from_config(model.config)))
    if have("seqbal calibrate") is None:
        from seqbal.timing import calibrate

        key = (case.list_name, case.cap)
        if key not in context.calibrations:
            start = time.perf_counter()
            cal = calibrate(model.step, lengths=data, max_token_len=case.cap,
                            device=model.device if model.device.startswith("cuda") else None)
            context.calibrations[key] = (cal, time.perf_counter() - start)
        add("seqbal calibrate", lambda: fastest_route(lengths, case.ranks, case.cap, context.calibrations[key][0]))
        fitted = recorder_fit(model, data, case, args.recorder_steps, args.micro_batches)
        add("seqbal recorder", lambda: fastest_route(lengths, case.ranks, case.cap, fitted))
    else:
        add("seqbal calibrate", list)
        add("seqbal recorder", list)
    add("verl 0.9.1", lambda: verl_route(lengths, case.ranks, case.cap))
    count = len(plans["seqbal default"][0])
    add("transformers BatchRebalanceSampler", lambda: transformers_route(lengths, case.ranks, count))
    add("prime-rl packer", lambda: prime_rl_packer.plan(lengths.tolist(), case.cap, case.ranks, model.config))
    return plans, seconds


def run_case(model: Model, case: Case, context: Context, args: argparse.Namespace, rng: np.random.Generator) -> list[dict]:
    data = list_lengths(case.list_name, case.cap)
    lengths = global_batch(data, case.ranks, case.cap, args.micro_batches, seed=0)
    plans, planning = plans_for(model, case, lengths, data, context, args)
    if args.control:
        plans[CONTROL] = [plans["seqbal default"][0]] * case.ranks
        planning[CONTROL] = 0.0
    for name, parts in plans.items():
        if name == CONTROL:
            continue
        placed = sorted(i for rank in parts for mb in rank for i in mb)
        if placed != list(range(len(lengths))):
            raise ValueError(f"{name} placed {len(placed)} samples ({len(set(placed))} distinct) of {len(lengths)}")
    times = time_plans(model, lengths, plans, args.repeats, rng)
    rows = []
    for name, parts in plans.items():
        best = times[name].min(axis=0)
        per_mb, per_step = efficiency(best)
        each = [efficiency(times[name][k]) for k in range(args.repeats)]
        proxy_mb, proxy_step = efficiency(proxy_grid(lengths, parts))
        tokens = [int(lengths[mb].sum()) for rank in parts for mb in rank]
        rows.append(dict(
            model=model.name, list=case.list_name, ranks=case.ranks, cap=case.cap, samples=len(lengths), row=name,
            per_mb=per_mb, per_step=per_step, proxy_per_mb=proxy_mb, proxy_per_step=proxy_step,
            noise_per_mb=max(e[0] for e in each) - min(e[0] for e in each),
            noise_per_step=max(e[1] for e in each) - min(e[1] for e in each),
            counts=sorted({len(rank) for rank in parts}), largest_over_cap=max(tokens) / case.cap,
            step_seconds=float(best.sum(axis=1).max()), planning_seconds=planning[name],
        ))
    return rows


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


def summary_table(rows: list[dict]) -> list[str]:
    """Per row: clock and proxy efficiency (worst / mean), cases where it is the best, noise."""
    cases = {(r["model"], r["list"], r["ranks"], r["cap"]) for r in rows}
    key = lambda r: (r["model"], r["list"], r["ranks"], r["cap"])  # noqa: E731
    planned = [r for r in rows if r["row"] != CONTROL]
    best_mb = {c: max(r["per_mb"] for r in planned if key(r) == c) for c in cases}
    best_step = {c: max(r["per_step"] for r in planned if key(r) == c) for c in cases}
    default_seconds = {key(r): r["step_seconds"] for r in rows if r["row"] == "seqbal default"}
    lines = [
        "| row | cases | clock, per micro-batch sync: worst / mean | proxy: mean | clock, per step sync: worst / mean "
        "| proxy: mean | best of the case (per mb / per step) | noise, median (per mb / per step) | largest micro-batch / cap "
        "| step seconds / default's: worst / mean | micro-batches per rank |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in (*ROWS, CONTROL):
        mine = [r for r in rows if r["row"] == name]
        if not mine:
            continue
        top_mb = sum(r["per_mb"] >= best_mb[key(r)] - 1e-12 for r in mine)
        top_step = sum(r["per_step"] >= best_step[key(r)] - 1e-12 for r in mine)
        lines.append(
            f"| {name} | {len(mine)} | {min(r['per_mb'] for r in mine):.3f} / {np.mean([r['per_mb'] for r in mine]):.3f} "
            f"| {np.mean([r['proxy_per_mb'] for r in mine]):.4f} "
            f"| {min(r['per_step'] for r in mine):.3f} / {np.mean([r['per_step'] for r in mine]):.3f} "
            f"| {np.mean([r['proxy_per_step'] for r in mine]):.4f} | {top_mb} / {top_step} "
            f"| {statistics.median(r['noise_per_mb'] for r in mine):.3f} / {statistics.median(r['noise_per_step'] for r in mine):.3f} "
            f"| {max(r['largest_over_cap'] for r in mine):.2f} | {_seconds_ratio(mine, default_seconds, key)} "
            f"| {_count_range(mine)} |"
        )
    return lines


def _seconds_ratio(mine: list[dict], default_seconds: dict, key) -> str:
    """Worst / mean of the row's step seconds (slowest rank's total) over the default row's, per
    case: what the plan costs, beside how even it is."""
    ratios = [r["step_seconds"] / default_seconds[key(r)] for r in mine
              if key(r) in default_seconds and default_seconds[key(r)] > 0]
    return f"{max(ratios):.3f} / {np.mean(ratios):.3f}" if ratios else "-"


def _count_range(mine: list[dict]) -> str:
    counts = sorted({c for r in mine for c in r["counts"]})
    return f"{counts[0]}-{counts[-1]}" if len(counts) > 1 else str(counts[0])


def _mean_table(rows: list[dict], column_of, headers: list[str], columns: list) -> list[str]:
    """Mean clock efficiency of each row in each column (per micro-batch / per step);
    ``column_of(row)`` is a result row's column."""
    lines = ["| row | " + " | ".join(headers) + " |", "|---|" + "---|" * len(columns)]
    for name in (*ROWS, CONTROL):
        cells = []
        for column in columns:
            mine = [r for r in rows if r["row"] == name and column_of(r) == column]
            cells.append(f"{np.mean([r['per_mb'] for r in mine]):.3f} / {np.mean([r['per_step'] for r in mine]):.3f}"
                         if mine else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def by_model_table(rows: list[dict]) -> list[str]:
    """Mean clock efficiency of each row on each model (per micro-batch / per step)."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    return _mean_table(rows, lambda r: r["model"], models, models)


def by_list_table(rows: list[dict]) -> list[str]:
    """Mean clock efficiency of each row on each length list and cap (per micro-batch / per step)."""
    columns = list(dict.fromkeys((r["list"], r["cap"]) for r in rows))
    headers = [f"{name.removesuffix('.txt')}, cap {cap}" for name, cap in columns]
    return _mean_table(rows, lambda r: (r["list"], r["cap"]), headers, columns)


def goal_lines(rows: list[dict]) -> list[str]:
    """Where the calibrated routes reach 0.98 per step, 0.97 per micro-batch sync and the top."""
    key = lambda r: (r["model"], r["list"], r["ranks"], r["cap"])  # noqa: E731
    rows = [r for r in rows if r["row"] != CONTROL]
    cases = sorted({key(r) for r in rows})
    lines = []
    for name in CALIBRATED:
        mine = {key(r): r for r in rows if r["row"] == name}
        if not mine:
            lines.append(f"- {name}: not run")
            continue
        step_ok = sum(r["per_step"] >= 0.98 for r in mine.values())
        mb_ok = sum(r["per_mb"] >= 0.97 for r in mine.values())
        top_step = sum(mine[c]["per_step"] >= max(r["per_step"] for r in rows if key(r) == c) - 1e-12 for c in mine)
        top_mb = sum(mine[c]["per_mb"] >= max(r["per_mb"] for r in rows if key(r) == c) - 1e-12 for c in mine)
        within = sum(
            mine[c]["per_step"] >= max(r["per_step"] for r in rows if key(r) == c) - max(r["noise_per_step"] for r in rows if key(r) == c)
            and mine[c]["per_mb"] >= max(r["per_mb"] for r in rows if key(r) == c) - max(r["noise_per_mb"] for r in rows if key(r) == c)
            for c in mine)
        lines.append(f"- {name}: per step >= 0.98 in {step_ok} of {len(mine)} cases, per micro-batch >= 0.97 in "
                     f"{mb_ok}; the top row per step in {top_step}, per micro-batch in {top_mb}; within the case's "
                     f"noise of the top on both in {within} of {len(cases)}")
    return lines


def run_model(size: str, attention: str, args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Every case on one model (one process): rows and notes."""
    import torch

    torch.set_num_threads(1)  # the thread's CPU time is then the step's whole CPU time
    if getattr(args, "keep_freed_memory", False) and not args.device.startswith("cuda"):
        from benchmarks.tiny_lm import keep_freed_memory

        keep_freed_memory()  # no page faults of glibc's mmap in the clock (tiny_lm.keep_freed_memory)
    model = make_model(size, attention, args.device, getattr(args, "packing", "split"))
    rng = np.random.default_rng([SEED, list(SIZES).index(size), ATTENTION.index(attention)])
    context = Context()
    rows: list[dict] = []
    started = time.perf_counter()
    for cap in args.caps:  # the cheapest cases first
        for ranks in args.ranks:
            for name in args.lists:
                rows += (case_rows := run_case(model, Case(name, ranks, cap), context, args, rng))
                if args.json:  # every case as soon as it is done: a cut-short run keeps what it measured
                    with open(f"{args.json}.partial", "a") as handle:
                        handle.writelines(json.dumps(row) + "\n" for row in case_rows)
                print(f"{model.name} {name} ranks={ranks} cap={cap} done ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)
    notes = list(context.notes)
    for (name, cap), (cal, seconds) in context.calibrations.items():
        notes.append(f"{model.name}, {name}, cap {cap}: calibrate took {len(cal.probes)} probes, {seconds:.1f} s")
    return rows, notes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="h32 SDPA, the shipped rollouts, 4 ranks, cap 1024")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--packing", choices=("split", "slices"), default="split",
                        help="how the tiny model cuts each sequence's attention window: split (default, as a "
                             "varlen kernel's cost grows) or slices (a per-sequence zero gradient the size of "
                             "the micro-batch in the backward)")
    parser.add_argument("--models", nargs="+", default=list(MODELS),
                        choices=[f"{size} {kind}" for size in SIZES for kind in ATTENTION])
    parser.add_argument("--lists", nargs="+", default=list(LISTS))
    parser.add_argument("--ranks", nargs="+", type=int, default=list(RANKS))
    parser.add_argument("--caps", nargs="+", type=int, default=list(CAPS))
    parser.add_argument("--micro-batches", type=int, default=3, help="cap-sized micro-batches per rank (about)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per micro-batch, best kept")
    parser.add_argument("--recorder-steps", type=int, default=2, help="steps recorded before the recorder's fit")
    parser.add_argument("--jobs", type=int, default=1, help="models timed in that many processes at once")
    parser.add_argument("--malloc-default", dest="keep_freed_memory", action="store_false",
                        help="leave glibc's malloc as it is: large freed buffers are unmapped and faulted in again "
                             "at the next call, a system time the clock then includes (benchmarks/tiny_lm.py)")
    parser.add_argument("--control", action="store_true",
                        help="also time a control: rank 0's micro-batches on every rank (the clock's noise floor)")
    parser.add_argument("--json", help="also write every row to this JSON file")
    parser.add_argument("--tables", metavar="JSON", nargs="+",
                        help="only print the tables of saved runs (--json files, or their .partial rows, one per line, also as .jsonl)")
    args = parser.parse_args(argv)
    if args.tables:
        rows, notes = [], []
        for path in args.tables:
            text = Path(path).read_text()
            if path.endswith((".partial", ".jsonl")):  # rows written one per line as each case ends
                rows += [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                rows += json.loads(text)["rows"]
                notes += [n for n in json.loads(text)["notes"] if n not in notes]
        print_tables(rows, notes)
        return 0
    if args.quick:
        args.models, args.lists, args.ranks, args.caps = ["h32 sdpa"], [LISTS[0]], [4], [1024]
        args.micro_batches, args.repeats, args.recorder_steps = 2, 2, 1
    import torch

    started = time.perf_counter()
    models = [tuple(name.split()) for name in args.models]  # in the given order: heaviest first
    if args.jobs > 1 and len(models) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(args.jobs, len(models))) as pool:
            results = list(pool.map(run_model, *zip(*models), [args] * len(models)))
    else:
        results = [run_model(size, attention, args) for size, attention in models]
    rows = [r for result in results for r in result[0]]
    notes = list(dict.fromkeys(n for result in results for n in result[1]))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=rows, notes=notes), indent=1))
    command = "python -m benchmarks.clock" + (" --quick" if args.quick else "") + f" --packing {args.packing}"
    cases = len({(r["model"], r["list"], r["ranks"], r["cap"]) for r in rows})
    print(f"<!-- {command}: python {platform.python_version()}, torch {torch.__version__}, {args.device}, "
          f"{cases} cases, best of {args.repeats}, {time.perf_counter() - started:.0f} s -->\n")
    print_tables(rows, notes)
    return 0


def print_tables(rows: list[dict], notes: Sequence[str]) -> None:
    print("\n".join(summary_table(rows)))
    print("\nMean clock efficiency by model (per micro-batch sync / per step sync):\n")
    print("\n".join(by_model_table(rows)))
    print("\nMean clock efficiency by length list and cap (per micro-batch sync / per step sync):\n")
    print("\n".join(by_list_table(rows)))
    print("\n" + "\n".join(goal_lines(rows)))
    if notes:
        print("\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    sys.exit(main())
