"""seqbal against verl 0.9.1's own rearrange_micro_batches, on what verl's engines hand it.

    python -m benchmarks.verl_engine            # needs verl 0.9.1 importable (see .ci/run)

Batches of 256 no-padding samples (jagged ``input_ids`` and ``(bs, 4, j)`` mRoPE
``position_ids``, a ``uid`` NonTensorStack, NonTensorData settings) drawn from the 800 shipped
Qwen2.5-Math CoT rollout lengths, 20 seeds per cap; one process, verl and seqbal side by side
on the same batch, so the time ratio is meaningful on a noisy machine. Reports counts (against
``ceildiv(total, cap)`` and seqbal's packing lower bound), largest micro-batch, the ratio of
call times, and the time of cutting the micro-batches out of the batch: seqbal's
``select_rows``, verl's ``index_select_tensor_dict`` and tensordict's ``batch[idx]`` (which
raises on jagged entries before tensordict 0.15.3).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tensordict  # noqa: E402
import torch  # noqa: E402
from tensordict import NonTensorData, NonTensorStack, TensorDict  # noqa: E402

import seqbal  # noqa: E402
from seqbal.tensordict_compat import select_rows  # noqa: E402

BATCH, SEEDS, CAPS = 256, 20, (4096, 8192, 16384)
LENGTHS = np.loadtxt(Path(seqbal.__file__).parent / "data" / "qwen25math_cot_rollouts.txt", dtype=np.int64)


def no_padding_batch(lengths):
    jagged = lambda rows: torch.nested.as_nested_tensor(rows, layout=torch.jagged)  # noqa: E731
    batch = TensorDict(
        {
            "input_ids": jagged([torch.randint(0, 150000, (int(k),)) for k in lengths]),
            "position_ids": jagged([torch.arange(int(k)).expand(4, int(k)).clone() for k in lengths]),
            "loss_mask": jagged([torch.ones(int(k), dtype=torch.bool) for k in lengths]),
        },
        batch_size=[len(lengths)],
    )
    batch["uid"] = NonTensorStack(*[f"uid-{i // 8}" for i in range(len(lengths))])
    batch["use_dynamic_bsz"] = NonTensorData(True)
    return batch


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import verl
        from verl.utils import seqlen_balancing as verl_balancing
        from verl.utils import tensordict_utils as tu

    torch.manual_seed(0)
    print(f"verl {verl.__version__}, tensordict {tensordict.__version__}, torch {torch.__version__}, "
          f"batch {BATCH} samples from the shipped rollout lengths, {SEEDS} seeds per cap\n")
    print("| cap | mean ceildiv | mean lower bound | mean count verl | mean count seqbal | seqbal < verl | seqbal > verl "
          "| largest mb verl / seqbal | time seqbal / verl (median, worst) |")
    print("|---|---|---|---|---|---|---|---|---|")
    select_times = {"select_rows": [], "verl index_select_tensor_dict": [], "batch[idx]": []}
    index_error = None
    for cap in CAPS:
        rows = []
        for seed in range(SEEDS):
            lengths = np.random.default_rng(seed).choice(LENGTHS, size=BATCH)
            batch = no_padding_batch(lengths)
            (_, verl_parts), verl_time = timed(verl_balancing.rearrange_micro_batches, batch, max_token_len=cap)
            (_, parts), seqbal_time = timed(seqbal.rearrange_micro_batches, batch, max_token_len=cap)
            largest = lambda ps: max(int(lengths[p].sum()) for p in ps)  # noqa: E731
            rows.append(dict(
                ceildiv=seqbal.ceildiv(int(lengths.sum()), cap),
                bound=seqbal.packing_lower_bound(lengths.tolist(), cap),
                verl=len(verl_parts), seqbal=len(parts),
                verl_max=largest(verl_parts), seqbal_max=largest(parts),
                ratio=seqbal_time / verl_time,
            ))
            for name, select in (
                ("select_rows", lambda: [select_rows(batch, p) for p in parts]),
                ("verl index_select_tensor_dict", lambda: [tu.index_select_tensor_dict(batch, p) for p in parts]),
                ("batch[idx]", lambda: [batch[torch.as_tensor(p)] for p in parts]),
            ):
                try:
                    select_times[name].append(timed(select)[1])
                except NotImplementedError as error:
                    index_error = f"{type(error).__name__}: {error}"
        mean = lambda key: statistics.mean(r[key] for r in rows)  # noqa: E731
        ratios = [r["ratio"] for r in rows]
        print(f"| {cap} | {mean('ceildiv'):.2f} | {mean('bound'):.2f} | {mean('verl'):.2f} | {mean('seqbal'):.2f} "
              f"| {sum(r['seqbal'] < r['verl'] for r in rows)}/{SEEDS} | {sum(r['seqbal'] > r['verl'] for r in rows)}/{SEEDS} "
              f"| {max(r['verl_max'] for r in rows)} / {max(r['seqbal_max'] for r in rows)} "
              f"| {statistics.median(ratios):.2f}, {max(ratios):.2f} |")
    print("\nCutting the micro-batches out of one batch (all micro-batches of one call), "
          f"median over {len(select_times['select_rows'])} calls:\n")
    base = statistics.median(select_times["verl index_select_tensor_dict"])
    for name, times in select_times.items():
        if times:
            print(f"- {name}: {statistics.median(times) * 1e3:.1f} ms ({statistics.median(times) / base:.2f}x verl's)")
        else:
            print(f"- {name}: raises {index_error}")


if __name__ == "__main__":
    main()
