"""Real ``SFTTrainer.train()`` runs on 2 gloo ranks: TRL's sample-count batching, transformers'
``BatchRebalanceSampler`` and seqbal's token budget, measured rather than modelled.

``benchmarks/trl.py`` counts what each route's plan would put in a forward; this one trains. Each
route is a fresh ``torchrun`` launch of 2 CPU ranks running TRL's ``SFTTrainer`` (its own loss,
metrics and collectives) on the same data for the same epochs:

- a small Llama built from a config (nothing downloaded), float32, sdpa attention, the same
  initial weights on every route;
- the first ``--samples`` lengths of a real list (the rollouts shipped in ``seqbal/data`` by
  default; ``--lengths`` picks one of ``../shared/data/lengths``), clipped to the budget, filled
  with seeded random token ids;
- ``padding_free=True`` (TRL's collator packs a micro-batch into one row), one micro-batch per
  optimizer step, the same seed.

Routes, all with ``per_device_train_batch_size = B = round(budget / mean length)`` as
``benchmarks/trl.py`` chooses it (the sample count that averages the budget):

- ``trl``: TRL's and transformers' own batching, ``B`` samples per forward;
- ``hf-rebalance``: ``train_sampling_strategy="batch_rebalance"`` (transformers'
  ``BatchRebalanceSampler``, ``B`` samples per rank per step on average);
- ``seqbal``: ``seqbal.integrations.trl.install(budget)``, whatever sampler it installs.

Measured on every rank, per epoch (``on_epoch_begin`` to ``on_epoch_end`` of a ``TrainerCallback``):

- wall time (the slower rank's) and trained tokens per second (all ranks' forwarded tokens);
- forwards, tokens per forward (a forward pre-hook on the model), forwards over the budget;
- time blocked waiting for the other rank: every synchronous collective the trainer calls in the
  epoch (the token count gathered before each forward, the metrics gathered after it) timed around
  the call, plus, per step, the time from this rank's last gradient bucket being ready to its
  all-reduce completing (a DDP communication hook). A rank that finishes its forward or backward
  early waits in these calls for the other one, so their sum is the rank imbalance. The gradient
  all-reduce alone would show only the backward's share: SFTTrainer syncs after the forward too;
- peak resident memory (the kernel's ``VmHWM``, reset at each epoch's start through
  ``/proc/self/clear_refs``): what the operating system charges the rank, allocator caches
  included. Where the reset is refused it is the high-water mark since the process started.

Routes are interleaved (round ``r`` runs them rotated by ``r``) and every ratio is taken against
TRL's route of the same round. Timings are of this machine's CPUs: attention is sdpa with a
block-diagonal mask over the packed row, so its cost grows with the square of the packed length,
where a GPU's varlen kernels grow with the sum of the sequences' squares.

    python -m benchmarks.trl_train            # docs/benchmarks.md, "A measured training step"
    python -m benchmarks.trl_train --smoke    # a tiny model and 24 samples, 1 round: seconds of training
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .workloads import REAL_FILES, real_data_dir

ROOT = Path(__file__).resolve().parent.parent
ROUTES = ("trl", "hf-rebalance", "seqbal")
REFERENCE = "trl"
WORLD = 2
#: The collectives a trainer calls synchronously; the time inside each is time blocked on the other rank.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "barrier",
               "reduce_scatter_tensor", "gather", "scatter", "broadcast_object_list")


@dataclass
class Config:
    """One benchmark's settings, passed to every rank on its command line."""

    samples: int = 200
    """Samples trained per epoch (the first ones of the list)."""
    budget: int = 4096
    """Token budget per forward: seqbal's cap, and what ``B`` averages for the other routes."""
    epochs: int = 1
    rounds: int = 3
    """Launches of every route, interleaved."""
    lengths: str = "shipped_rollouts"
    """``shipped_rollouts`` (seqbal/data) or a name of ``workloads.REAL_FILES`` without ``real_``."""
    hidden: int = 128
    layers: int = 2
    heads: int = 2
    vocab: int = 4096
    threads: int = 1
    """torch threads per rank (2 ranks on a 2-core machine: 1)."""
    timeout: int = 600
    """Seconds one launch may take before its whole process group is killed."""
    malloc_mmap_threshold: int = 0
    """Bytes; > 0 sets glibc's ``MALLOC_MMAP_THRESHOLD_`` in the ranks, so every larger block is
    mapped on allocation and unmapped when freed: the resident peak then follows the live tensors
    instead of what the heap kept from earlier steps (slower; for the memory column only)."""


def load_lengths(config: Config) -> tuple[np.ndarray, list[str]]:
    """The first ``config.samples`` lengths of the chosen list, clipped to ``[1, budget]`` (a
    sample over the budget fits no forward under seqbal), and notes on what was done."""
    notes: list[str] = []
    if config.lengths == "shipped_rollouts":
        values = np.loadtxt(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt", dtype=np.int64)
    else:
        name = "real_" + config.lengths
        if name not in REAL_FILES:
            raise ValueError(f"--lengths {config.lengths!r} is none of shipped_rollouts, "
                             + ", ".join(n.removeprefix("real_") for n in REAL_FILES))
        directory = real_data_dir()
        if directory is None or not (directory / REAL_FILES[name]).exists():
            raise FileNotFoundError(f"the length list {REAL_FILES[name]} is not checked out (looked in "
                                    f"../shared/data/lengths and $SEQBAL_LENGTHS_DIR); --lengths shipped_rollouts is")
        values = np.loadtxt(directory / REAL_FILES[name], dtype=np.int64, ndmin=1)
    if len(values) < config.samples:
        raise ValueError(f"--samples {config.samples} is more than the {len(values)} lengths of {config.lengths}")
    values = values[: config.samples]
    clipped = int((values > config.budget).sum())
    if clipped:
        notes.append(f"{clipped} of {config.samples} lengths clipped to the budget {config.budget}")
    return np.clip(values, 1, config.budget), notes


def batch_size(lengths: np.ndarray, budget: int) -> int:
    """``round(budget / mean length)``, at least 1: the sample count that averages the budget."""
    return max(1, round(budget / float(np.mean(lengths))))


# --------------------------------------------------------------------------------------------
# One rank of one route (run under torchrun)
# --------------------------------------------------------------------------------------------


def _status_kb(field: str) -> Optional[int]:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_peak() -> bool:
    """Reset the kernel's peak resident set (VmHWM) to the current one; False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_kb() -> int:
    import resource

    peak = _status_kb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class Probe:
    """The measurements of one rank: a ``TrainerCallback`` (epoch bounds, memory), a forward
    pre-hook (tokens per forward), timing wrappers around torch.distributed's synchronous
    collectives, and a DDP communication hook (the wait for the gradient all-reduce)."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []
        self.current: Optional[dict[str, Any]] = None
        self.buckets: list[tuple[int, float, float]] = []  # (forward index, ready, all-reduced)
        self.peak_reset = True
        self.trainer: Any = None

    # the model's forward
    def on_forward(self, module, args, kwargs) -> None:
        if self.current is None:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        positions = kwargs.get("position_ids")
        self.current["forwards"].append(int(ids.numel()))
        rows = int(ids.shape[0])
        self.current["samples"] += int((positions == 0).sum()) if positions is not None and rows == 1 else rows

    # synchronous collectives
    def wrap_collectives(self) -> None:
        import torch.distributed as dist

        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue

            def timed(*args, _original=original, **kwargs):
                if kwargs.get("async_op") or self.current is None:
                    return _original(*args, **kwargs)
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.current["sync_wait_s"] += time.perf_counter() - start
                    self.current["sync_calls"] += 1

            setattr(dist, name, timed)

    # the gradient all-reduce
    def comm_hook(self, state, bucket):
        import torch.distributed as dist

        step = len(self.current["forwards"]) if self.current is not None else -1
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size())
        ready = time.perf_counter()
        future = dist.all_reduce(buffer, async_op=True).get_future()

        def done(fut):
            self.buckets.append((step, ready, time.perf_counter()))
            return fut.value()[0]

        return future.then(done)

    def callback(self):
        from transformers import TrainerCallback

        probe = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                from torch.nn.parallel import DistributedDataParallel

                model = getattr(probe.trainer, "model_wrapped", None)
                if isinstance(model, DistributedDataParallel):
                    model.register_comm_hook(None, probe.comm_hook)

            def on_epoch_begin(self, args, state, control, **kwargs):
                probe.peak_reset = _reset_peak() and probe.peak_reset
                probe.buckets = []
                probe.current = {"forwards": [], "samples": 0, "sync_wait_s": 0.0, "sync_calls": 0,
                                 "start_rss_mb": (_status_kb("VmRSS") or 0) / 1024, "t0": time.perf_counter()}

            def on_epoch_end(self, args, state, control, **kwargs):
                epoch = probe.current
                epoch["wall_s"] = time.perf_counter() - epoch.pop("t0")
                epoch["peak_rss_mb"] = _peak_kb() / 1024
                steps: dict[int, list[tuple[float, float]]] = {}
                for step, ready, reduced in probe.buckets:
                    steps.setdefault(step, []).append((ready, reduced))
                epoch["allreduce_wait_s"] = sum(max(r for _, r in v) - max(t for t, _ in v) for v in steps.values())
                probe.epochs.append(epoch)
                probe.current = None

        return _Callback()


def build_model(config: Config):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    llama = LlamaConfig(
        vocab_size=config.vocab, hidden_size=config.hidden, intermediate_size=4 * config.hidden,
        num_hidden_layers=config.layers, num_attention_heads=config.heads, num_key_value_heads=config.heads,
        max_position_embeddings=config.budget, use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    llama._attn_implementation = "sdpa"
    return LlamaForCausalLM(llama)


def build_tokenizer(vocab: int):
    """A word-level tokenizer over ``vocab`` made-up words, built in memory (SFTTrainer wants one)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t3"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0", bos_token="t1", eos_token="t2",
                                   unk_token="t3")


def run_rank(route: str, config: Config, out: Path) -> None:
    """One rank of one route: train, then write ``out/rank<r>.json``."""
    import datasets
    import torch
    from trl import SFTConfig, SFTTrainer

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=config.timeout))
    torch.set_num_threads(config.threads)
    lengths, _ = load_lengths(config)
    rng = np.random.default_rng(0)
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [rng.integers(4, config.vocab, int(n)).tolist() for n in lengths]})
    model = build_model(config)
    probe = Probe()
    model.register_forward_pre_hook(probe.on_forward, with_kwargs=True)
    probe.wrap_collectives()
    sft = SFTConfig(
        output_dir=str(out / "trainer"), report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        disable_tqdm=True, seed=0, learning_rate=1e-4, lr_scheduler_type="constant", num_train_epochs=config.epochs,
        per_device_train_batch_size=batch_size(lengths, config.budget), gradient_accumulation_steps=1,
        padding_free=True, max_length=None, dataset_num_proc=None, ddp_find_unused_parameters=False,
        train_sampling_strategy="batch_rebalance" if route == "hf-rebalance" else "random",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if route == "seqbal":
            import seqbal.integrations.trl as seqbal_trl

            seqbal_trl.install(config.budget)
        trainer = SFTTrainer(model=model, args=sft, train_dataset=dataset, processing_class=build_tokenizer(config.vocab),
                             callbacks=[probe.callback()])
        probe.trainer = trainer
        trainer.train()
    record = {"route": route, "rank": rank, "world": world, "batch_size": sft.per_device_train_batch_size,
              "params": sum(p.numel() for p in model.parameters()), "peak_reset": probe.peak_reset,
              "epochs": probe.epochs}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    if world > 1:
        torch.distributed.destroy_process_group()


# --------------------------------------------------------------------------------------------
# The driver: launches, interleaving, the table
# --------------------------------------------------------------------------------------------


def config_flags(config: Config) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in asdict(config).items()]


def launch(route: str, config: Config, out: Path) -> list[dict]:
    """One route on ``WORLD`` ranks; every rank's record. Past ``config.timeout`` the launch's
    whole process group is killed (no rank left waiting in a collective) and RuntimeError raised."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
               "-m", "benchmarks.trl_train", "--worker", route, "--out", str(out), *config_flags(config)]
    env = dict(os.environ, OMP_NUM_THREADS=str(config.threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if config.malloc_mmap_threshold > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(config.malloc_mmap_threshold)
    process = subprocess.Popen(command, cwd=str(ROOT), env=env, start_new_session=True, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = process.communicate(timeout=config.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise RuntimeError(f"{route}: killed past its {config.timeout} s deadline:\n{output[-3000:]}")
    except BaseException:  # interrupted: take the ranks down too
        os.killpg(process.pid, signal.SIGKILL)
        raise
    if process.returncode != 0:
        raise RuntimeError(f"{route}: exit status {process.returncode}:\n{output[-3000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def epoch_figures(records: list[dict], budget: int) -> list[dict]:
    """Per epoch of one launch, over its ranks: wall (the slower rank), tokens, forwards."""
    figures = []
    for epoch in range(len(records[0]["epochs"])):
        ranks = [r["epochs"][epoch] for r in records]
        forwards = [t for e in ranks for t in e["forwards"]]
        wall = max(e["wall_s"] for e in ranks)
        figures.append({
            "wall_s": wall,
            "tokens": sum(forwards),
            "tokens_per_s": sum(forwards) / wall,
            "samples": sum(e["samples"] for e in ranks),
            "forwards_per_rank": [len(e["forwards"]) for e in ranks],
            "max_tokens": max(forwards),
            "over_budget": sum(t > budget for t in forwards),
            "blocked_s": max(e["sync_wait_s"] + e["allreduce_wait_s"] for e in ranks),
            "allreduce_wait_s": max(e["allreduce_wait_s"] for e in ranks),
            "peak_rss_mb": max(e["peak_rss_mb"] for e in ranks),
            "peak_rss_per_rank_mb": [e["peak_rss_mb"] for e in ranks],
            "peak_above_start_mb": max(e["peak_rss_mb"] - e["start_rss_mb"] for e in ranks),
        })
    return figures


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """``median [min-max]``."""
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def _ints(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def summarize(results: dict[str, list[list[dict]]]) -> list[dict]:
    """One row per route from ``results[route][round]`` (that round's epochs); ratios against
    ``REFERENCE`` of the same round and epoch."""
    rows = []
    reference = results.get(REFERENCE)
    for route, rounds in results.items():
        epochs = [e for r in rounds for e in r]
        row = {
            "route": route,
            "wall_s": [e["wall_s"] for e in epochs],
            "tokens_per_s": [e["tokens_per_s"] for e in epochs],
            "blocked_s": [e["blocked_s"] for e in epochs],
            "blocked_share": [e["blocked_s"] / e["wall_s"] for e in epochs],
            "allreduce_wait_s": [e["allreduce_wait_s"] for e in epochs],
            "peak_rss_mb": [e["peak_rss_mb"] for e in epochs],
            "peak_above_start_mb": [e["peak_above_start_mb"] for e in epochs],
            "peak_rss_per_rank_mb": [e["peak_rss_per_rank_mb"] for e in epochs],
            "forwards": [f for e in epochs for f in e["forwards_per_rank"]],
            "max_tokens": max(e["max_tokens"] for e in epochs),
            "over_budget": [e["over_budget"] for e in epochs],
            "samples": sorted({e["samples"] for e in epochs}),
            "tokens": sorted({e["tokens"] for e in epochs}),
        }
        if reference is not None:
            pairs = [(e, ref) for r, ref_r in zip(rounds, reference) for e, ref in zip(r, ref_r)]
            row["wall_ratio"] = [e["wall_s"] / ref["wall_s"] for e, ref in pairs]
            row["tokens_per_s_ratio"] = [e["tokens_per_s"] / ref["tokens_per_s"] for e, ref in pairs]
            row["peak_ratio"] = [e["peak_rss_mb"] / ref["peak_rss_mb"] for e, ref in pairs]
        rows.append(row)
    return rows


HEADER = ("| route | epoch wall, s | vs TRL | tokens/s | vs TRL | forwards/epoch per rank | max tok/fwd "
          "| fwd over budget /epoch | blocked on the other rank, s/epoch (share of wall) | of it, gradient all-reduce, s "
          "| peak RSS per rank, MB | vs TRL | peak above the epoch's start, MB |")


def format_row(row: dict) -> str:
    ratio = lambda key: spread(row[key], "{:.2f}") if key in row else "-"  # noqa: E731
    return (f"| {row['route']} | {spread(row['wall_s'])} | {ratio('wall_ratio')} | {spread(row['tokens_per_s'], '{:.0f}')} "
            f"| {ratio('tokens_per_s_ratio')} | {_ints(row['forwards'])} | {row['max_tokens']} | {_ints(row['over_budget'])} "
            f"| {spread(row['blocked_s'])} ({100 * statistics.median(row['blocked_share']):.0f}%) "
            f"| {spread(row['allreduce_wait_s'])} | {spread(row['peak_rss_mb'], '{:.0f}')} | {ratio('peak_ratio')} "
            f"| {spread(row['peak_above_start_mb'], '{:.0f}')} |")


def format_table(rows: list[dict]) -> str:
    return "\n".join([HEADER, "|" + "---|" * 13] + [format_row(r) for r in rows])


def run(config: Config, routes: Sequence[str] = ROUTES, log=print, keep: Optional[Path] = None) -> tuple[list[dict], list[str]]:
    """Every route ``config.rounds`` times, interleaved; the summary rows and notes."""
    lengths, notes = load_lengths(config)
    notes.append(f"{config.samples} samples of {config.lengths} ({int(lengths.sum())} tokens, mean "
                 f"{lengths.mean():.0f}), budget {config.budget}, B = {batch_size(lengths, config.budget)}, "
                 f"{config.epochs} epoch(s), {config.rounds} round(s), {WORLD} gloo ranks of {config.threads} thread(s)")
    if config.malloc_mmap_threshold > 0:
        notes.append(f"MALLOC_MMAP_THRESHOLD_={config.malloc_mmap_threshold} in the ranks")
    results: dict[str, list[list[dict]]] = {route: [] for route in routes}
    with tempfile.TemporaryDirectory(prefix="trl_train_") as scratch:
        base = keep or Path(scratch)
        for round_ in range(config.rounds):
            order = list(routes[round_ % len(routes):]) + list(routes[: round_ % len(routes)])
            for route in order:
                start = time.perf_counter()
                records = launch(route, config, base / f"round{round_}" / route)
                results[route].append(epoch_figures(records, config.budget))
                if round_ == 0 and route == order[0]:
                    notes.append(f"model: {records[0]['params'] / 1e6:.2f} M parameters")
                note = f"{route}: the peak could not be reset: high-water mark since the process started"
                if not all(r["peak_reset"] for r in records) and note not in notes:
                    notes.append(note)
                log(f"round {round_} {route}: epoch wall {[round(e['wall_s'], 1) for e in results[route][-1]]} s, "
                    f"launch {time.perf_counter() - start:.0f} s")
    rows = summarize(results)
    samples = {tuple(r["samples"]) for r in rows}
    if len(samples) > 1:
        notes.append("samples trained per epoch differ: " + ", ".join(f"{r['route']} {r['samples']}" for r in rows))
    return rows, notes


def parse(argv: Optional[Sequence[str]]) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Config()
    for key, value in asdict(defaults).items():
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=type(value), default=value)
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 24 samples, budget 1024, 1 round")
    parser.add_argument("--json", help="write the summary rows here too")
    parser.add_argument("--keep", help="keep every rank's raw record under this folder")
    parser.add_argument("--worker", choices=ROUTES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    config = Config(**{key: getattr(options, key) for key in asdict(defaults)})
    if options.smoke:
        config = Config(samples=24, budget=1024, epochs=1, rounds=1, lengths=config.lengths, hidden=32, layers=1,
                        heads=2, vocab=64, threads=1, timeout=config.timeout,
                        malloc_mmap_threshold=config.malloc_mmap_threshold)
    return options, config


def main(argv: Optional[Sequence[str]] = None) -> int:
    options, config = parse(argv)
    if options.worker:
        run_rank(options.worker, config, Path(options.out))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed driver takes its launch's ranks down
    rows, notes = run(config, options.routes, log=lambda *a: print(*a, file=sys.stderr, flush=True),
                      keep=Path(options.keep) if options.keep else None)
    print(format_table(rows))
    for note in notes:
        print("-", note)
    if options.json:
        Path(options.json).write_text(json.dumps({"config": asdict(config), "rows": rows, "notes": notes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
