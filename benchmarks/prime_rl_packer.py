"""prime-rl's trainer-batch packer, re-implemented for the clock benchmark (not prime-rl's code).

Read from PrimeIntellect-ai/prime-rl at commit ``559b44772e471d1538537b8805cc77f3824a5e64``
(``src/prime_rl/trainer/batch.py``: ``build_bin_cost``, ``packed_samples_into_micro_bs``,
``_expand_bins_by_splitting``, ``balanced_partition``) and written again here on plain lists, so
that the benchmark runs it without prime-rl's package (its rollout types, vLLM, its pins). What
it does, in its order:

1. **Cost from the model config**: a micro-batch of sequence lengths ``s`` costs
   ``linear * sum(s) + quadratic * sum(s**2)``, with ``linear`` the forward FLOPs per token of
   the q/k/v projections (GQA-aware), the output projection, a gated MLP (``6 * hidden *
   intermediate``) per layer and the LM head (``2 * hidden * vocab``), and ``quadratic`` the
   attention's ``2 * heads * head_dim`` per layer; without a config, ``(1, 0)`` (tokens).
2. **First-fit decreasing under ``seq_len``**: samples by decreasing length (ties in input
   order), each into the first bin whose token count stays within ``seq_len``, else a new bin.
3. **Split to the data-parallel multiple**: while the bin count is below the next multiple of
   the rank count (at least one per rank), the most costly bin with more than one sample is
   split in two, longest-processing-time (its samples by decreasing cost, each to the lighter
   half).
4. **Karmarkar-Karp over ranks**: the bins' costs sorted ascending and taken ``ranks`` at a time
   as the starting states (one bin per rank each, so every rank gets the same bin count), states
   merged largest spread first, heaviest set with lightest.
5. **Pairwise swaps**: repeatedly the single swap of two bins between two ranks that most lowers
   ``(max load, max - min load)``, until none does.

Each rank runs its bins in ascending bin index (the FFD order, split halves appended).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Mapping, Sequence

REVISION = "559b44772e471d1538537b8805cc77f3824a5e64"


def cost_coefficients(config: Mapping[str, Any]) -> tuple[int, int]:
    """``(linear, quadratic)`` per-sequence forward-FLOP coefficients of a dense config dict, as
    prime-rl's ``_packing_cost_coeffs`` computes them for a non-MLA, non-MoE model."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    layers = int(config["num_hidden_layers"])
    intermediate = int(config["intermediate_size"])
    qkv = 2 * hidden * heads * head_dim + 4 * hidden * kv_heads * head_dim
    per_layer = qkv + 2 * hidden * hidden + 6 * hidden * intermediate
    return layers * per_layer + 2 * hidden * int(config["vocab_size"]), layers * 2 * heads * head_dim


def bin_cost(config: Mapping[str, Any] | None) -> Callable[[Sequence[int]], int]:
    """The cost of a bin of sequence lengths under ``config`` (tokens when ``None``)."""
    linear, quadratic = (1, 0) if config is None else cost_coefficients(config)
    return lambda lengths: linear * sum(lengths) + quadratic * sum(s * s for s in lengths)


def _first_fit_decreasing(lengths: Sequence[int], seq_len: int) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: ties in input order
        for b, load in enumerate(loads):
            if load + lengths[i] <= seq_len:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


def _split_to_multiple(bins: list[list[int]], lengths: Sequence[int], ranks: int, cost: Callable[[Sequence[int]], int]) -> None:
    target = max(-(-len(bins) // ranks) * ranks, ranks)
    while len(bins) < target:
        candidates = [(cost([lengths[i] for i in b]), b_index) for b_index, b in enumerate(bins) if len(b) > 1]
        if not candidates:
            return
        _, b_index = max(candidates)
        left: list[int] = []
        right: list[int] = []
        left_cost = right_cost = 0
        for i in sorted(bins[b_index], key=lambda i: -cost([lengths[i]])):
            if left_cost <= right_cost:
                left.append(i)
                left_cost += cost([lengths[i]])
            else:
                right.append(i)
                right_cost += cost([lengths[i]])
        bins[b_index] = left
        bins.append(right)


class _State:
    """A KK state: ``k`` sets of (total, items), sorted heaviest first."""

    def __init__(self, sets: list[tuple[int, list[int]]]) -> None:
        self.sets = sorted(sets, key=lambda s: (s[0], s[1]), reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0][0] - self.sets[-1][0]

    def merge(self, other: "_State") -> None:
        k = len(self.sets)
        self.sets = sorted(((a[0] + b[0], a[1] + b[1]) for a, b in zip(self.sets, reversed(other.sets))),
                           key=lambda s: (s[0], s[1]), reverse=True)
        assert len(self.sets) == k

    def __lt__(self, other: "_State") -> bool:  # heapq pops the largest spread first
        if self.spread != other.spread:
            return self.spread > other.spread
        return (self.sets[0][0], self.sets[0][1]) > (other.sets[0][0], other.sets[0][1])


def _karmarkar_karp(weights: Sequence[int], k: int) -> list[list[int]]:
    order = sorted((w, i) for i, w in enumerate(weights))
    heap = [_State([(w, [i]) for w, i in order[start:start + k]]) for start in range(0, len(order), k)]
    heapq.heapify(heap)
    while len(heap) > 1:
        state = heapq.heappop(heap)
        state.merge(heapq.heappop(heap))
        heapq.heappush(heap, state)
    return [sorted(items) for _, items in heap[0].sets]


def _swap_refine(weights: Sequence[int], parts: list[list[int]]) -> list[list[int]]:
    loads = [sum(weights[i] for i in p) for p in parts]
    while True:
        best, best_score = None, (max(loads), max(loads) - min(loads))
        for a in range(len(parts)):
            for b in range(a + 1, len(parts)):
                for pa, i in enumerate(parts[a]):
                    for pb, j in enumerate(parts[b]):
                        new = list(loads)
                        new[a] += weights[j] - weights[i]
                        new[b] += weights[i] - weights[j]
                        score = (max(new), max(new) - min(new))
                        if score < best_score:
                            best, best_score = (a, b, pa, pb, new), score
        if best is None:
            return parts
        a, b, pa, pb, loads = best
        parts[a][pa], parts[b][pb] = parts[b][pb], parts[a][pa]


def plan(lengths: Sequence[int], seq_len: int, ranks: int, config: Mapping[str, Any] | None) -> list[list[list[int]]]:
    """Per rank, per micro-batch (run order), the sample indices prime-rl's packer gives.

    Samples longer than ``seq_len`` must have been clipped by the caller (prime-rl truncates them).
    If splitting cannot reach a multiple of ``ranks`` (too few multi-sample bins), prime-rl pads
    with zero-loss dummy bins; here those are empty micro-batches.
    """
    lengths = [int(s) for s in lengths]
    if max(lengths) > seq_len:
        raise ValueError(f"a sample of {max(lengths)} tokens is longer than seq_len={seq_len}: clip first")
    cost = bin_cost(config)
    bins = _first_fit_decreasing(lengths, seq_len)
    if ranks > 1:
        _split_to_multiple(bins, lengths, ranks, cost)
    bins += [[] for _ in range(-len(bins) % ranks)]
    weights = [cost([lengths[i] for i in b]) for b in bins]
    parts = _swap_refine(weights, _karmarkar_karp(weights, ranks))
    return [[bins[b] for b in sorted(part)] for part in parts]
