"""Time calibration against timed micro-batches: a tiny causal transformer, eager and SDPA.

    python -m benchmarks.timing                  # CPU, both attention kinds, the real lists
    python -m benchmarks.timing --quick          # seconds: a smaller model, one list
    python -m benchmarks.timing --hidden 256 --heads 4 --layers 4 --held-out 4   # a larger model

For each attention kind: :func:`seqbal.timing.calibrate` on the model's step (synthetic probes
for any lengths, up to the cap: every list below is held out), timed with its wall time and the
CPU time of the process; then, for each real length list (``benchmarks/workloads.py``; the shipped
sample when the others are absent), ``--samples`` lengths drawn from it are planned with
``build_dp_schedule(..., workload_fn=cal.workload_fn)`` over ``--ranks`` ranks, and
micro-batches of that plan (none of them a probe: held out) are timed with the same clock,
the fastest of ``--repeats``, and compared with ``cal.predict``. The step runs on one thread
(``torch.set_num_threads(1)``), which the thread's CPU time measures whole. Results:
docs/timing.md and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import workloads  # noqa: E402

SHIPPED = Path(str(resources.files("seqbal") / "data" / "qwen25math_cot_rollouts.txt"))


def real_lists(quick: bool) -> dict[str, np.ndarray]:
    lists = {"qwen_rollouts (shipped)": np.loadtxt(SHIPPED, dtype=np.int64)}
    directory = workloads.real_data_dir()
    if directory is not None and not quick:
        for name in ("real_gsm8k", "real_alpaca_eval", "real_codealpaca"):
            path = directory / workloads.REAL_FILES[name]
            if path.exists():
                lists[name[5:]] = np.loadtxt(path, dtype=np.int64, ndmin=1)
    return lists


def run_kind(kind: str, args: argparse.Namespace) -> dict:
    import torch

    from benchmarks.tiny_lm import TinyLM, make_step
    from seqbal import build_dp_schedule
    from seqbal.timing import calibrate, time_step

    torch.manual_seed(0)
    model = TinyLM(hidden=args.hidden, heads=args.heads, layers=args.layers, attention=kind, packing=args.packing)
    step = make_step(model)
    lists = real_lists(args.quick)
    probe_lengths = np.minimum(next(iter(lists.values())), args.cap) if args.probe_lengths == "shipped" else None
    wall, cpu = time.perf_counter(), time.process_time()
    cal = calibrate(step, lengths=probe_lengths, max_token_len=args.cap, probes=args.probes, repeats=args.repeats,
                    device="cpu")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows = []
    rng = np.random.default_rng(args.seed)
    for name, source in lists.items():
        batch = np.minimum(rng.choice(source, size=args.samples), args.cap)
        schedule = build_dp_schedule(batch, args.ranks, args.cap, workload_fn=cal.workload_fn)
        micro = [[int(batch[schedule.rank_indices[r][i]]) for i in mb]
                 for r in range(args.ranks) for mb in schedule.local_micro_batches(r)]
        picks = np.random.default_rng(args.seed + 1).permutation(len(micro))[: args.held_out]
        for index in picks:
            lengths = micro[int(index)]
            seconds = time_step(lambda: step(lengths), "cpu", repeats=args.repeats)
            rows.append({"list": name, "sequences": len(lengths), "tokens": sum(lengths), "seconds": seconds,
                         "predicted": cal.predict(lengths), "error": cal.predict(lengths) / seconds - 1})
    errors = [abs(r["error"]) for r in rows]
    return {
        "kind": kind, "probes": len(cal.probes), "calibrate_wall_s": wall, "calibrate_cpu_s": cpu,
        "step_calls": cal.warmup + cal.repeats * len(cal.probes), "explain": cal.explain(),
        "held_out": len(rows), "median_error": statistics.median(errors), "worst_error": max(errors),
        "worst_over": max(r["error"] for r in rows), "worst_under": min(r["error"] for r in rows),
        "rows": rows,
        "probe_rows": [{"shape": p.shape, "sequences": len(p.lengths), "tokens": sum(p.lengths), "seconds": p.seconds,
                    "error": cal.predict(p.lengths) / p.seconds - 1} for p in cal.probes],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="eager,sdpa")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--cap", type=int, default=4096)
    parser.add_argument("--probes", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--held-out", type=int, default=8, help="micro-batches timed per list")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--packing", choices=("split", "slices"), default="split",
                        help="how the tiny model cuts sequences from the packed tokens (benchmarks/tiny_lm.py)")
    parser.add_argument("--probe-lengths", choices=("none", "shipped"), default="none",
                        help="calibrate on synthetic probes for any lengths (none, the default: every list is held "
                             "out) or within the shipped rollouts' range")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--malloc-default", dest="keep_freed_memory", action="store_false",
                        help="leave glibc's malloc as it is: large freed buffers are unmapped and faulted in again "
                             "at the next call, a system time the clock then includes (benchmarks/tiny_lm.py)")
    parser.add_argument("--verbose", action="store_true", help="print every held-out micro-batch")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.cap, args.samples, args.held_out, args.kinds = 64, 1, 1024, 40, 4, "sdpa"
    import torch

    torch.set_num_threads(1)
    if args.keep_freed_memory:
        from benchmarks.tiny_lm import keep_freed_memory

        keep_freed_memory()  # no page faults of glibc's mmap in the clock (tiny_lm.keep_freed_memory)
    results = []
    print(f"tiny transformer hidden {args.hidden}, {args.layers} layers, {args.heads} heads; cap {args.cap}; "
          f"{args.ranks} ranks x {args.samples} samples per list; one thread")
    print(f"{'attention':<10}{'probes':>7}{'calls':>7}{'wall s':>8}{'cpu s':>7}{'held out':>9}{'median':>8}"
          f"{'worst':>7}{'over':>7}{'under':>7}")
    for kind in args.kinds.split(","):
        r = run_kind(kind, args)
        results.append(r)
        print(f"{kind:<10}{r['probes']:>7}{r['step_calls']:>7}{r['calibrate_wall_s']:>8.1f}{r['calibrate_cpu_s']:>7.1f}"
              f"{r['held_out']:>9}{r['median_error']:>8.1%}{r['worst_error']:>7.1%}{r['worst_over']:>+7.1%}"
              f"{r['worst_under']:>+7.1%}")
        if args.verbose:
            print("  " + r["explain"])
            for probe in r["probe_rows"]:
                print(f"    probe {probe['shape']:<8} n={probe['sequences']:>3} tokens={probe['tokens']:>5} "
                      f"{probe['seconds']:.4f}s ({probe['error']:+.1%})")
            for row in r["rows"]:
                print(f"    {row['list']:<24} n={row['sequences']:>3} tokens={row['tokens']:>5} "
                      f"{row['seconds']:.4f}s predicted {row['predicted']:.4f}s ({row['error']:+.1%})")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
