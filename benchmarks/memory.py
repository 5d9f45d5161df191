"""Calibrated memory caps against metered peaks: a tiny causal transformer, eager and SDPA.

    python -m benchmarks.memory                 # CPU, two model shapes, both attention kinds, the real lists
    python -m benchmarks.memory --shapes wide --kinds eager    # one shape, one attention kind
    python -m benchmarks.memory --quick         # seconds: one kind, one list, two micro-batches
    python -m benchmarks.memory --device cuda --budget-mib 4096 --large   # the GPU variant

For each attention kind: :func:`seqbal.memory.calibrate` on synthetic probes only (no real
lengths: every micro-batch below is held out), then for each real length list
(``benchmarks/workloads.py``; the shipped Qwen2.5-Math sample when the others are absent) a
batch of ``--samples`` lengths drawn from it is planned twice: against bytes
(``plan_micro_batches(batch, cal.byte_cap, cost_model=cal.cost_model)``) and against the token
cap calibrated for that list (``cal.rebudget(lengths=the list).max_token_len``, token cost).
Every planned micro-batch is metered (:func:`seqbal.memory.measure_peak`) and compared with
the prediction; none may peak above the budget. Samples whose lone prediction exceeds the
budget less the margin cannot run under it at all and are left out (counted in the table).
Results: docs/memory.md and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402

#: The rollouts shipped in the installed package (CI's wheel environment has no source tree).
SHIPPED = Path(str(resources.files("seqbal") / "data" / "qwen25math_cot_rollouts.txt"))
#: Budgets of the CPU run: the bytes a step adds (the CPU meter is relative), chosen so that
#: micro-batches of a few thousand tokens fit and a run takes minutes on two cores.
CPU_BUDGETS_MIB = {("small", "eager"): 512, ("small", "sdpa"): 256, ("wide", "eager"): 1024, ("wide", "sdpa"): 512,
                   ("large", "eager"): 4096, ("large", "sdpa"): 4096}


@dataclass
class Metered:
    list_name: str
    plan: str  # "bytes" or "tokens"
    lengths: list[int]
    predicted: int
    peak: int

    @property
    def error(self) -> float:
        return self.predicted / self.peak - 1


@dataclass
class KindResult:
    kind: str
    shape: str
    device: str
    budget: int
    byte_cap: int
    max_token_len_any: int
    probes_run: int
    probes_failed: int
    probe_fit_worst: float
    calibration_s: float
    model: dict
    largest_probe: int = 0  # tokens of the largest metered probe
    largest_probe_bytes: int = 0
    caps: dict = field(default_factory=dict)  # list -> token cap for that list
    dropped: dict = field(default_factory=dict)  # list -> samples over the budget alone
    counts: dict = field(default_factory=dict)  # list -> {"bytes": n, "tokens": n}
    metered: list = field(default_factory=list)


def length_lists(only: Optional[list[str]] = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """The real lists by name, and notes on what is missing."""
    lists, notes = {}, []
    directory = workloads.real_data_dir()
    for name, file in workloads.REAL_FILES.items():
        if only and name not in only:
            continue
        if directory is not None and (directory / file).exists():
            lists[name] = np.loadtxt(directory / file, dtype=np.int64, ndmin=1)
        elif name == "real_qwen_rollouts" and SHIPPED.exists():
            lists[name] = np.loadtxt(SHIPPED, dtype=np.int64, ndmin=1)
        else:
            notes.append(f"{name}: {file} not found, skipped")
    return lists, notes


#: Model shapes: the CPU's two (a second shape tests that the fitted form is not tuned to one
#: model) and the GPU's.
SHAPES = {
    "small": {},  # TinyLM's defaults: hidden 128, 2 heads, 2 layers, vocabulary 2048
    "wide": dict(hidden=256, heads=4, layers=4, vocab=4096),
    "large": dict(vocab=32768, hidden=1024, heads=8, layers=4),
}


def model_and_step(kind: str, device: str, large: bool, seed: int = 0, shape: str = "small") -> Callable:
    import torch

    from benchmarks.tiny_lm import TinyLM, make_step

    torch.manual_seed(seed)
    model = TinyLM(attention=kind, **SHAPES["large" if large else shape]).to(device)
    return make_step(model, device, seed)


def run_kind(kind: str, budget: int, device: str, lists: dict[str, np.ndarray], samples: int, seed: int,
             large: bool = False, per_plan: Optional[int] = None, log: Callable[[str], None] = print,
             shape: str = "small") -> KindResult:
    """Calibrate one attention kind and meter the micro-batches planned on each list."""
    import seqbal
    from seqbal.memory import calibrate, measure_peak

    step = model_and_step(kind, device, large, seed, shape)
    started = time.perf_counter()
    cal = calibrate(step, budget, device=device)
    calibration_s = time.perf_counter() - started
    errors = cal.probe_errors()
    result = KindResult(
        kind, "large" if large else shape, device, budget, cal.byte_cap, cal.max_token_len, sum(1 for p in cal.probes if p.peak_bytes),
        sum(1 for p in cal.probes if p.peak_bytes is None), max(map(abs, errors)), calibration_s,
        asdict(cal.model),
    )
    reach = cal.extrapolation()
    result.largest_probe, result.largest_probe_bytes = int(reach["largest_probe"]), int(reach["largest_probe_bytes"])
    log(f"{kind}: {cal.explain()} ({calibration_s:.0f} s)")
    rng = np.random.default_rng(seed)
    for name, values in lists.items():
        batch = rng.choice(values, size=samples, replace=len(values) < samples)
        fits = np.array([cal.predict([int(s)]) <= cal.byte_cap for s in batch])
        result.dropped[name] = int((~fits).sum())
        batch = batch[fits].tolist()
        token_cap = cal.rebudget(lengths=values[[cal.predict([int(s)]) <= cal.byte_cap for s in values]]).max_token_len
        result.caps[name] = token_cap
        plans = {
            "bytes": seqbal.plan_micro_batches(batch, cal.byte_cap, cost_model=cal.cost_model),
            "tokens": seqbal.plan_micro_batches(batch, token_cap),
        }
        result.counts[name] = {plan: len(parts) for plan, parts in plans.items()}
        for plan, parts in plans.items():
            chosen = parts
            if per_plan is not None:  # the heaviest first: those are the ones near the budget
                chosen = sorted(parts, key=lambda p: -cal.predict([batch[i] for i in p]))[:per_plan]
            for part in chosen:
                lengths = [int(batch[i]) for i in part]
                peak = measure_peak(lambda: step(lengths), device)
                result.metered.append(Metered(name, plan, lengths, cal.predict(lengths), peak))
        log(f"  {name}: cap {token_cap} tokens, {result.counts[name]} micro-batches, {result.dropped[name]} dropped")
    return result


def summary(result: KindResult) -> dict:
    errors = np.array([abs(m.error) for m in result.metered])
    signed = np.array([m.error for m in result.metered])
    peaks = np.array([m.peak for m in result.metered])
    return {
        "kind": result.kind,
        "shape": result.shape,
        "metered": len(result.metered),
        "median_error": float(np.median(errors)),
        "worst_error": float(errors.max()),
        "most_over": float(max(signed.max(), 0.0)),
        "most_under": float(min(signed.min(), 0.0)),
        "max_peak_over_budget": float(peaks.max() / result.budget),
        "over_budget": int((peaks > result.budget).sum()),
    }


def format_tables(results: list[KindResult]) -> str:
    lines = [
        "| model | attention | budget | cap (any lengths) | probes | largest probe | fit on probes | micro-batches metered | median error | worst over / under | largest peak / budget | over budget |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = summary(r)
        lines.append(
            f"| {r.shape} | {r.kind} | {r.budget / 2**20:,.0f} MiB | {r.max_token_len_any:,} | {r.probes_run}"
            f"{f' ({r.probes_failed} not run)' if r.probes_failed else ''} | {r.largest_probe:,} tokens, "
            f"{r.largest_probe_bytes / r.budget:.2f} of the budget | {r.probe_fit_worst:.1%} | {s['metered']} | "
            f"{s['median_error']:.1%} | +{s['most_over']:.1%} / {s['most_under']:.1%} | {s['max_peak_over_budget']:.3f} | "
            f"{s['over_budget']} |"
        )
    lines += ["", "| model | attention | list | token cap | micro-batches (bytes / tokens) | samples over the budget alone | worst error | largest peak / budget |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        for name in r.caps:
            ms = [m for m in r.metered if m.list_name == name]
            lines.append(
                f"| {r.shape} | {r.kind} | {name} | {r.caps[name]:,} | {r.counts[name]['bytes']} / {r.counts[name]['tokens']} | "
                f"{r.dropped[name]} | {max(abs(m.error) for m in ms):.1%} | {max(m.peak for m in ms) / r.budget:.3f} |"
            )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kinds", nargs="+", default=["eager", "sdpa"])
    parser.add_argument("--budget-mib", type=int, default=None,
                        help="default on the CPU: 512 (eager) and 256 (sdpa) for small, 1024 and 512 for wide")
    parser.add_argument("--samples", type=int, default=160, help="lengths drawn from each list (default 160)")
    parser.add_argument("--lists", nargs="*", default=None, help="real list names (default all)")
    parser.add_argument("--per-plan", type=int, default=None, help="meter only the heaviest N micro-batches of each plan")
    parser.add_argument("--shapes", nargs="+", default=["small", "wide"], choices=["small", "wide"],
                        help="CPU model shapes (default both): small (hidden 128, 2 heads, 2 layers), "
                             "wide (hidden 256, 4 heads, 4 layers, vocabulary 4096)")
    parser.add_argument("--large", action="store_true", help="a GPU-sized model (hidden 1024, 4 layers, vocab 32768)")
    parser.add_argument("--quick", action="store_true", help="sdpa, the shipped list, 16 samples, 2 micro-batches per plan")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="write every metered micro-batch here")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cpu":
        torch.set_num_threads(1)  # one allocation order, one peak; and the machine is shared
    if args.quick:
        args.kinds, args.lists, args.samples, args.per_plan = ["sdpa"], ["real_qwen_rollouts"], 16, 2
        args.shapes = ["small"]
    lists, notes = length_lists(args.lists)
    for note in notes:
        print(note)
    results = []
    for shape in (["large"] if args.large else args.shapes):
        for kind in args.kinds:
            budget = (args.budget_mib or CPU_BUDGETS_MIB[(shape, kind)]) << 20
            results.append(run_kind(kind, budget, args.device, lists, args.samples, args.seed, args.large,
                                    args.per_plan, shape=shape))
    print(format_tables(results))
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "summary": summary(r)} for r in results], indent=1))
    bad = [summary(r) for r in results if summary(r)["over_budget"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
