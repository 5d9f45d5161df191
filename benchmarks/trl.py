"""seqbal's token-budget sampler beside TRL's and transformers' own batching, on real lengths.

One epoch of each length list (seqbal's shipped rollouts and the lists of
``../shared/data/lengths``), at 4 and 8 data-parallel ranks, one micro-batch per optimizer step
(``gradient_accumulation_steps=1``), a forward budget of ``CAP`` tokens:

- ``trl-padding-free``: TRL's ``padding_free=True`` with a sample count: torch's
  ``DistributedSampler`` and ``per_device_train_batch_size = B``, ``B = round(CAP / mean length)``
  (the count that averages the budget);
- ``trl-bfd``: TRL's ``pack_dataset(strategy="bfd")`` into rows of ``CAP`` tokens (its own
  code; it truncates longer samples), one row per forward, rows dealt by ``DistributedSampler``;
- ``hf-rebalance``: transformers' ``BatchRebalanceSampler`` (its own code), ``B`` samples per
  rank per step on average;
- ``seqbal``: :class:`seqbal.epochs.sampler.TokenBudgetBatchSampler` under ``CAP``.

Per route: tokens per forward (max, p50), padding if each forward were padded to its longest
sample, forwards over the cap, steps per epoch (per rank; ``a/b`` when ranks differ), per-step
rank imbalance (max over ranks of a step's tokens / their mean; mean and worst over steps) and
planning time for the epoch (all ranks). A route whose package is missing is skipped with a note.

    python -m benchmarks.trl                 # the table (docs/benchmarks.md, "TRL and transformers")
    python -m benchmarks.trl --smoke         # seconds: small slices, for tests/test_benchmark_smoke.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from importlib.resources import files
from typing import Callable, Optional

import numpy as np

from seqbal.epochs.sampler import TokenBudgetBatchSampler

from .workloads import REAL_FILES, real_data_dir

CAP = 8192
WORLDS = (4, 8)


@dataclass
class Row:
    lengths: str
    world: int
    route: str
    max_tokens: int
    p50_tokens: float
    padding: float
    over_cap: int
    steps: str
    imbalance_mean: float
    imbalance_max: float
    plan_ms: float


def length_lists(limit: Optional[int] = None) -> dict[str, np.ndarray]:
    """The shipped list, then every shared list present (the shared copy of the shipped one is
    skipped)."""
    lists = {"shipped_rollouts": np.loadtxt(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt", dtype=np.int64)}
    directory = real_data_dir()
    if directory is not None:
        for name, file in REAL_FILES.items():
            if file != "qwen25math_cot_rollouts.txt" and (directory / file).exists():
                lists[name.removeprefix("real_")] = np.loadtxt(directory / file, dtype=np.int64, ndmin=1)
    return {name: values[:limit] if limit else values for name, values in lists.items()}


def sample_count_route(lengths, world, batch, seed=0) -> list[list[list[int]]]:
    """TRL padding-free with a sample count: DistributedSampler + batches of ``batch``."""
    from torch.utils.data import DistributedSampler

    plans = []
    for rank in range(world):
        order = list(DistributedSampler(range(len(lengths)), num_replicas=world, rank=rank, shuffle=True, seed=seed))
        plans.append([order[i : i + batch] for i in range(0, len(order), batch)])
    return plans


def bfd_route(lengths, world, cap, seed=0) -> tuple[list[list[list[int]]], np.ndarray]:
    """TRL's pack_dataset bfd rows (its own code), one row per forward, rows dealt by
    DistributedSampler. Returns per rank the rows (as row ids) and every row's tokens."""
    import datasets
    from torch.utils.data import DistributedSampler
    from trl.data_utils import pack_dataset

    dataset = datasets.Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    packed = pack_dataset(dataset, seq_length=cap, strategy="bfd")
    row_tokens = np.array([sum(s) for s in packed["seq_lengths"]], dtype=np.int64)
    plans = [
        [[row] for row in DistributedSampler(range(len(row_tokens)), num_replicas=world, rank=rank, shuffle=True, seed=seed)]
        for rank in range(world)
    ]
    return plans, row_tokens


def rebalance_route(lengths, world, batch, seed=0) -> list[list[list[int]]]:
    """transformers' BatchRebalanceSampler, its own code."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    return [
        list(BatchRebalanceSampler(lengths.tolist(), batch * world, world, 1, seed=seed, rank=rank, drop_last=False))
        for rank in range(world)
    ]


def seqbal_route(lengths, world, cap, seed=0) -> list[list[list[int]]]:
    return TokenBudgetBatchSampler(lengths.tolist(), cap, num_replicas=world, rank=0, seed=seed).epoch_plan(0)


def measure(name, world, route, plans, item_tokens, cap, elapsed) -> Row:
    """Figures of one route's epoch; ``item_tokens[i]`` the tokens of item ``i`` (a sample, or
    a packed row whose padding is nil)."""
    tokens = [[int(item_tokens[mb].sum()) for mb in rank] for rank in plans]
    flat = [t for rank in tokens for t in rank]
    padded = sum(len(mb) * int(item_tokens[mb].max()) for rank in plans for mb in rank) if route != "trl-bfd" else sum(flat)
    counts = sorted({len(rank) for rank in tokens})
    imbalance = []
    for step in range(min(counts)):
        work = [rank[step] for rank in tokens]
        imbalance.append(max(work) / (sum(work) / len(work)))
    return Row(
        lengths=name, world=world, route=route, max_tokens=max(flat), p50_tokens=float(statistics.median(flat)),
        padding=1 - sum(flat) / padded, over_cap=sum(t > cap for t in flat),
        steps="/".join(map(str, counts)), imbalance_mean=float(np.mean(imbalance)),
        imbalance_max=float(max(imbalance)), plan_ms=1e3 * elapsed,
    )


def timed(fn: Callable):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def run(limit: Optional[int] = None, cap: int = CAP, worlds=WORLDS, log=print) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    for module in ("torch.utils.data", "datasets", "trl.data_utils", "transformers.trainer_pt_utils"):
        try:  # imports are not planning time
            __import__(module)
        except ImportError:
            pass
    for name, lengths in length_lists(limit).items():
        lengths = np.asarray(lengths, dtype=np.int64)
        batch = max(1, round(cap / float(lengths.mean())))
        for world in worlds:
            routes = {
                "trl-padding-free": lambda: (sample_count_route(lengths, world, batch), lengths),
                "trl-bfd": lambda: bfd_route(lengths, world, cap),
                "hf-rebalance": lambda: (rebalance_route(lengths, world, batch), lengths),
                "seqbal": lambda: (seqbal_route(np.minimum(lengths, cap), world, cap), np.minimum(lengths, cap)),
            }
            for route, build in routes.items():
                try:
                    (plans, item_tokens), elapsed = timed(build)
                except (ImportError, AttributeError) as error:
                    note = f"{route}: skipped ({type(error).__name__}: {error})"
                    if note not in notes:
                        notes.append(note)
                    continue
                rows.append(measure(name, world, route, plans, np.asarray(item_tokens), cap, elapsed))
                log(format_row(rows[-1]))
    return rows, notes


HEADER = ("| lengths | ranks | route | max tok/fwd | p50 tok/fwd | padding if padded | fwd over cap | steps/epoch "
          "| step imbalance mean / max | plan ms |")


def format_row(r: Row) -> str:
    return (f"| {r.lengths} | {r.world} | {r.route} | {r.max_tokens} | {r.p50_tokens:.0f} | {100 * r.padding:.1f}% "
            f"| {r.over_cap} | {r.steps} | {r.imbalance_mean:.3f} / {r.imbalance_max:.2f} | {r.plan_ms:.0f} |")


def format_table(rows: list[Row]) -> str:
    return "\n".join([HEADER, "|" + "---|" * 10] + [format_row(r) for r in rows])


def done_when(rows: list[Row]) -> list[str]:
    """The issue's targets: no seqbal forward over the cap, equal steps on every rank, per-step
    imbalance no worse than TRL's own routes on every list."""
    failures = []
    for r in rows:
        if r.route != "seqbal":
            continue
        if r.over_cap or "/" in r.steps:
            failures.append(f"{r.lengths}@{r.world}: over cap {r.over_cap}, steps {r.steps}")
        for other in rows:
            if (other.lengths, other.world) == (r.lengths, r.world) and other.route.startswith("trl"):
                if r.imbalance_mean > other.imbalance_mean:
                    failures.append(f"{r.lengths}@{r.world}: imbalance {r.imbalance_mean:.3f} > {other.route} {other.imbalance_mean:.3f}")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="first 400 lengths of each list, cap 4096")
    options = parser.parse_args()
    rows, notes = run(limit=400, cap=4096) if options.smoke else run(log=lambda *_: None)
    print(format_table(rows))
    for note in notes:
        print("-", note)
    failures = done_when(rows)
    print("- done-when targets:", "met" if not failures else "NOT met: " + "; ".join(failures))


if __name__ == "__main__":
    main()
