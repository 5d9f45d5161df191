"""Dataset-scale count search: the items planned in independent chunks, seams costing one part each.

One thorough count search costs a few packing passes plus repairs whose length grows with the
gap it bisects, which grows with ``n``: from 65,536 to 10^6 items the cost per item of one
search grew 1.5x to 3x (docs/benchmarks.md, dataset scale). A chunk of a few tens of thousands of items is where the
search is cheapest per item and its count is already within a fraction of a percent of the
bound, so large inputs are cut into chunks of at most :data:`CHUNK_ITEMS` items, each searched
and balanced on its own, and the parts put side by side: the cost per item is then flat in
``n`` by construction (O(n log CHUNK_ITEMS) in all).

Chunks are dealt from the items sorted by tokens, in a snake order (chunk 0, 1, ..., m - 1,
then m - 1, ..., 0, ...), so every chunk holds the same mix of long and short items and the
same share of every size class: each chunk's packing lower bound is about ``1 / m`` of the
whole one and each chunk's parts carry about the same mean workload.

What the seams cost, provably: chunk ``c`` with ``T_c`` tokens gets ``count_c`` parts, its own
search's answer, so the chunked count is ``sum(count_c)`` (before rounding up to ``min_count``
and ``step``), and since ``sum(ceildiv(T_c, cap)) <= ceildiv(T, cap) + m - 1``, its gap above
the plain bound is at most the sum of the chunks' own gaps above theirs plus one part per
seam (``m - 1``). Every chunk part respects the cap, every item is in exactly one chunk, and
the dealing and each chunk's search are deterministic, so the result is too.
"""

from __future__ import annotations

from itertools import chain
from typing import Callable, Sequence

import numpy as np

from .parts import _descending, ceildiv

# Tuning: how large a chunk is.

#: Largest chunk (trades the count, which a wider search lowers by hundredths of a percent,
#: against the cost per item, which grows with a search's width): inputs of more items are cut
#: into ``ceildiv(n, CHUNK_ITEMS)`` chunks of equal size (within one item), from three chunks on. Above the plan
#: hashes' largest case (16,384); with three chunks at least (:func:`chunk_count`), 65,536 items,
#: where the dataset-scale benchmark measures from, are still one search. On real_gsm8k at cap 4096, 10^6
#: samples, chunks of 65,536 needed 45,760 micro-batches, of 32,768 45,756 (one search: 45,756);
#: on real_qwen_rollouts 117,389 and 117,333 (one search: 117,419).
CHUNK_ITEMS = 32768
#: ... and every chunk must need at least this many parts by the plain bound (trades the one
#: part a seam may cost against the search's width): an input of many items in few parts
#: (short items under a long cap) is one search, where a chunk's part lost to rounding would
#: be a large share of the count.
MIN_PARTS_PER_CHUNK = 256

def chunk_count(n: int, bound: int) -> int:
    """How many chunks ``n`` items needing at least ``bound`` parts (``ceildiv(total, cap)``)
    are planned in: ``ceildiv(n, CHUNK_ITEMS)``, fewer where a chunk would need fewer than
    :data:`MIN_PARTS_PER_CHUNK` parts, and 1 (one search) below 3: two chunks cost the whole
    input's packing on top of two searches, more than one search of both (grpo_groups,
    125,000 groups of 8 at cap 4096: 1.4 s in two chunks, 1.0 s in one). O(1)."""
    chunks = min(ceildiv(n, CHUNK_ITEMS), bound // MIN_PARTS_PER_CHUNK)
    return chunks if chunks >= 3 else 1


def deal_chunks(size: np.ndarray, chunks: int) -> list[np.ndarray]:
    """The item indices of each chunk, ascending: the items by descending size (index breaks
    ties) dealt in snake order, so chunk sizes differ by at most one item. O(n log n)."""
    order = np.asarray(_descending(size), dtype=np.int64)
    position = np.arange(len(order))
    lap, seat = np.divmod(position, chunks)
    chunk_of = np.where(lap % 2 == 0, seat, chunks - 1 - seat)
    label = np.empty(len(order), dtype=np.int64)
    label[order] = chunk_of
    by_chunk = np.argsort(label, kind="stable")  # ascending index within a chunk
    bounds = np.searchsorted(label[by_chunk], np.arange(chunks + 1))
    return [by_chunk[bounds[c]:bounds[c + 1]] for c in range(chunks)]


def in_chunk(members: np.ndarray, parts: list[list[int]]) -> list[list[int]]:
    """A chunk's parts (indices into the chunk) as indices into the whole input, in one NumPy
    gather (not a Python step per item). O(items)."""
    flat, starts = _flat(parts)
    return _cut(members[flat].tolist(), starts)


def _flat(parts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The parts' indices one after another, and where each part starts (one more entry: the
    end). O(items)."""
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    flat = np.fromiter(chain.from_iterable(parts), dtype=np.int64, count=int(starts[-1]))
    return flat, starts


def _cut(values: list[int], starts: np.ndarray) -> list[list[int]]:
    """``values`` cut into lists at ``starts`` (as :func:`_flat` gives them). O(items)."""
    bounds = starts.tolist()
    return [values[a:b] for a, b in zip(bounds, bounds[1:])]


Balance = Callable[[np.ndarray, np.ndarray, int, "list[list[int]]"], "list[list[int]]"]


def balanced_in_chunks(
    size: np.ndarray, work: np.ndarray, bins: list[list[int]], chunks: int, balance: Balance
) -> list[list[int]]:
    """A cap-respecting packing of the whole input (``bins``, as many as the result) balanced
    chunk by chunk: the bins dealt like items (:func:`deal_chunks` on their workloads), each
    chunk's items balanced into as many parts as it has bins by ``balance(tokens, workloads,
    k, feasible)``, given those bins as the known partition. The count is ``len(bins)``.
    O(n) beyond the balances."""
    flat, starts = _flat(bins)
    bin_work = np.add.reduceat(work[flat], starts[:-1]) if len(bins) else np.zeros(0, dtype=np.int64)
    lengths = np.diff(starts)
    parts: list[list[int]] = []
    for chosen in deal_chunks(bin_work, chunks):
        # The chosen bins' items one after another, gathered in NumPy (bins are non-empty).
        chosen_lengths = lengths[chosen]
        local_starts = np.zeros(len(chosen) + 1, dtype=np.int64)
        np.cumsum(chosen_lengths, out=local_starts[1:])
        offsets = np.repeat(starts[chosen] - local_starts[:-1], chosen_lengths)
        index = flat[offsets + np.arange(int(local_starts[-1]))]
        local = _cut(list(range(len(index))), local_starts)
        parts.extend(in_chunk(index, balance(size[index], work[index], len(local), local)))
    return parts
