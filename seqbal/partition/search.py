"""The count search: the smallest count at which a cap-respecting partition is found.

The count comes before the balance. It lies between the packing lower bound and the count of a
packing, and the search runs over "a partition into at most ``k`` parts is known", monotone by
construction (a known partition splits up to any larger count), so bisection is sound: a few
counts one by one from the bound (the answer is usually there), one below the packing, then
bisection, then a walk down below the bisection's last failure (the try itself is not
monotone). Each probe is one feasibility try at O(n log k), so a search is a handful of
packing passes instead of the older design's tens of full KK repartitions.

The range a search bisects and the repairs of its failing tries both grow with ``n``, so
from three chunks of :data:`seqbal.partition.chunks.CHUNK_ITEMS` on (past 65,536 items) the
search runs on chunks instead, against one packing of the whole input
(:func:`_chunked_search`; why and what the seams cost: :mod:`seqbal.partition.chunks`).

A search runs with Python's cyclic garbage collector paused (:func:`_collector_paused`): it
builds millions of small lists, none in a cycle, and every full collection walks all of them,
a cost per item that grows with the input (on its own 1.4x per sample from 65,536 to 10^6).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator, Optional

import numpy as np

from ..validation import IntSequence, as_int_array, check_count, check_items_fit, exact_total
from .balance import CHUNKED_KK_POLISH, SMALL_COUNT, _balance_at
from .bounds import _lower_bound
from .chunks import balanced_in_chunks, chunk_count, deal_chunks, in_chunk
from .feasibility import _fit_in, _Try
from .local_search import rebalance_within_capacity
from .packing import _best_fit_decreasing, _reserving_fill_partitions, split_bins_to_count
from .parts import _descending, ceildiv, roundup_divisible
from .progress import advance

# Tuning: which counts the search probes, and how hard each probe tries.

#: Searches over at most this many items (and at most SMALL_COUNT parts) try KK starts too,
#: with an unlimited repair (trades two more starts per probe for counts found on small
#: inputs): every pass is cheap there, and small inputs are where a missed count costs most.
THOROUGH_ITEMS = 256
#: Counts tried one by one from the bound before the search jumps below the packing (trades
#: probes for the common answer a count or two above the bound), unless a try stalls
#: (:data:`seqbal.partition.feasibility.STALLED_FRACTION`).
LINEAR_TRIES = 3
#: A chunked search (:mod:`seqbal.partition.chunks`) stops after this many chunks where the
#: rest, each as far above its plain bound as the chunks so far were on average, would need
#: as many parts as a packing of the whole input (trades a count the last chunks might still
#: win by a part or two against their searches: on lognormal lengths at cap 4096, 10^6
#: samples, the chunks' sum came to 12 parts above the packing after all 16 searches, half the
#: plan's time). It also stops there where every chunk so far landed on its own packing,
#: above its bound (no try found fewer parts): the chunks then only re-pack, which the whole
#: input's packing does without seams (near a third of the cap, 10^6 samples at cap 4096: 25
#: of the 31 chunks were searched, 60% of the plan's time, and lost to the packing).
PROBE_CHUNKS = 2
#: How close to its bound a chunk's balance is polished where its KK already fits the cap: the
#: rebalance's own 0.1% stop, not the 0.001% of :data:`seqbal.partition.balance.CHUNKED_KK_POLISH`
#: (trades a hundredth of a percent of balance for about a quarter of a dataset's plan: the
#: polish's last steps were half of bimodal_rl's plan at cap 32768, 10^6 samples, 6.6 -> 4.9 s
#: CPU, workload max/mean 1.00089 -> 1.00106). A single search keeps the finer polish.
CHUNK_POLISH = 0.001
#: ... nor win by at least this many parts per chunk left (trades a win within the chunks'
#: scatter, a part or two in all, against the searches left: on uniform lengths at cap 4096,
#: 10^6 samples, 11 chunks searched for a projected win of one part, which the chunks then
#: lost, a third of the plan's time; on real_gsm8k at cap 4096 they win by 32 parts and all
#: are searched).
PROBE_MARGIN = 0.5
#: Where a chunked search's chunks lose to the whole input's packing by the seams alone, the
#: whole input is tried once at its bound if no item exceeds this fraction of the cap
#: (:func:`_seams_only`; trades one try, about half a plan, against the parts the seams cost).
WHOLE_TRY_ITEM_FRACTION = 8
#: ... and where parts hold at least this many items on average (see :func:`_seams_only`).
WHOLE_TRY_ITEMS_PER_PART = 64
#: A chunked search packs the whole input with the reserving fill alone, without best-fit
#: decreasing, where parts hold at least this many items on average (see
#: :func:`_whole_packing`; trades the part best-fit decreasing might save on other data, which
#: it never did on the grid, against its pass).
FILL_ALONE_ITEMS_PER_PART = 64


def smallest_feasible_partitions(
    tokens: IntSequence,
    workloads: IntSequence,
    capacity: int,
    *,
    min_count: int = 1,
    step: int = 1,
) -> tuple[int, Optional[list[list[int]]]]:
    """The smallest count ``k`` (``>= min_count``, a multiple of ``step``) at which a
    cap-respecting partition is found, and a balanced partition at that count.

    The count is decided before any balancing. It lies between the bound ``k0`` (the larger
    of ``min_count`` and :func:`packing_lower_bound`, rounded up to ``step``; where the
    packing already meets ``ceildiv(total, capacity)`` that is ``k0`` and the stronger bound is
    not computed, and where everything fits in one part that part is the answer) and the count
    ``b`` of a packing rounded up to ``step``, where a partition is known (split the
    packing): best-fit decreasing, or where that lands above ``k0`` the better of it and
    :func:`_reserving_fill_partitions`. Counts below ``b`` are tried with one feasibility try,
    the same at every count (:func:`_fit_in`: LPT on workloads and on tokens, repaired). The
    search is over the predicate "a partition into at most ``k`` parts is known", which is
    monotone by construction (a known partition splits up to any larger count): it tries
    ``k0`` and the next two counts one by one (fewer if a try stalls, see
    :data:`STALLED_FRACTION`), then ``b - step``, then bisects between the last failure and
    the smallest success, then, since the try itself is not monotone, tries the counts below
    the bisection's last failure downwards until one fails. Then the partition is balanced
    once, at the final count (:func:`capped_balanced_partitions`, reusing the try's partition
    where it can). If the count exceeds the number of items, ``(count, None)`` is returned so
    the caller can report what was needed.

    Past 65,536 items (three chunks of :data:`seqbal.partition.chunks.CHUNK_ITEMS`, each
    needing 256 parts or more) the items are planned in chunks (:func:`_chunked_search`):
    the count is then at most a packing of the whole input and, where every chunk is
    searched, at most the chunks' own counts side by side (one part per seam above their own
    gaps), not necessarily the one a single search would find.

    Complexity: O(n log n) for the bound and the packings; 2 tries when the first stalls and
    the one below the packing fails, about ``4 + log2((b - k0) / step)`` otherwise, each
    O(n log k) plus the repair; one balance. In chunks: O(n log n) for the whole input's
    packing and the deal, plus that of one search per chunk of at most 32,768 items.

    >>> smallest_feasible_partitions([7] * 8, [7] * 8, 8)[0]
    8
    >>> smallest_feasible_partitions([5, 5, 5, 5, 4, 4], [5, 5, 5, 5, 4, 4], 10, step=2)[0]
    4
    """
    size = as_int_array(tokens, "tokens")
    work = as_int_array(workloads, "workloads")
    step = check_count(step, "step")
    min_count = check_count(min_count, "min_count")
    if step < 1 or min_count < 1:
        raise ValueError(f"step and min_count must be >= 1, got step={step}, min_count={min_count}")
    return _smallest_feasible(size, work, capacity, min_count, step)


def _smallest_feasible(
    size: np.ndarray, work: np.ndarray, capacity: int, min_count: int, step: int
) -> tuple[int, Optional[list[list[int]]]]:
    """:func:`smallest_feasible_partitions` on int64 arrays and ints ``>= 1`` (the plan's own
    call, whose arrays are checked already: it skips their conversion and int64 check, a
    tenth of a best-fit-decreasing pass at 64 items); the capacity and the items are still
    checked against each other."""
    capacity = check_items_fit(size, capacity)
    chunks = chunk_count(len(size), ceildiv(exact_total(size), capacity))
    with _collector_paused():
        if chunks > 1:
            return _chunked_search(size, work, capacity, chunks, min_count, step)
        found = _one_search(size, work, capacity, min_count, step)
    advance(len(size))
    return found


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the search, back as it was after.

    A search builds millions of small lists (parts, packings, heaps), none of them in a
    reference cycle, while the input's own lists stay alive; every full collection walks all
    of them, so its cost per item grows with ``n``: with the collector on, a plan of 10^6
    adv_half_cap samples cost 1.4x per sample what 65,536 did, with it off 1.15x (and 23%
    and 37% less). Nothing the search makes needs the collector: reference counting frees it.
    Another thread's collections wait until the search ends. O(1)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _one_search(
    size: np.ndarray, work: np.ndarray, capacity: int, min_count: int, step: int
) -> tuple[int, Optional[list[list[int]]]]:
    """:func:`smallest_feasible_partitions` as one search over all the items (checked arrays)."""
    count, known, found_by = _count_search(size, work, capacity, min_count, step)
    return count, _balanced(size, work, capacity, count, known, found_by)


def _balanced(
    size: np.ndarray, work: np.ndarray, capacity: int, count: int, known: Optional[list[list[int]]],
    found_by: Optional[_Try], polish: float = CHUNKED_KK_POLISH,
) -> Optional[list[list[int]]]:
    """The balance at the count a :func:`_count_search` found (one part is as it is); ``polish``
    as in :func:`seqbal.partition.balance._balance_at`."""
    if known is None or count == 1:
        return known
    return _balance_at(size, work, capacity, count, known, found_by, polish=polish, checked=True)


def _count_search(
    size: np.ndarray, work: np.ndarray, capacity: int, min_count: int, step: int, hint_gap: Optional[int] = None
) -> tuple[int, Optional[list[list[int]]], Optional[_Try]]:
    """The count of :func:`smallest_feasible_partitions`, before any balance: ``(count, a
    partition into at most count parts or None where count exceeds the items, the try that
    found it at that count or None)``; a count of 1 comes with its one part, final.
    ``hint_gap``: the search probes ``ceildiv(total, capacity) + hint_gap`` first (see
    :func:`_search_count`)."""
    n = len(size)

    def allowed(count: int) -> int:  # the least count >= count, >= min_count and a multiple of step
        return roundup_divisible(max(min_count, count, 1), step)

    # The plain bound ceildiv(total, cap) first: where the packing meets it, the stronger
    # bound (as costly as a packing pass) cannot say more, since it lies between the two.
    k0 = allowed(ceildiv(exact_total(size), capacity))
    if k0 == 1 and n:  # everything fits in one part: the only partition into one part
        return 1, [list(range(n))], None
    hint = None if hint_gap is None else allowed(ceildiv(exact_total(size), capacity) + hint_gap)
    hint_failed = False
    if hint is not None and k0 <= hint <= n and n > THOROUGH_ITEMS:
        # A chunk after the first probes where the chunks before it landed before it packs:
        # where that works (the common case), the counts below are walked down to the bound
        # and the chunk's own packings (two passes, a third of a chunk's search) are not needed.
        # Not on a few items, whose tries are thorough where the packing needs few parts.
        low = max(k0, allowed(_lower_bound(size, capacity)))
        if low <= hint:
            orders = (_descending(work), _descending(size))
            tried = _fit_in(size, work, capacity, hint, False, orders)
            if tried.parts is not None:
                return _walk_down(size, work, capacity, hint - step, low, step, set(), False, orders,
                                  (hint, tried.parts, tried))
            hint_failed = True
    packing = _best_fit_decreasing(size, capacity) if k0 <= n else []  # the items were checked above
    packed = allowed(len(packing))
    if packed > k0:
        k0 = allowed(_lower_bound(size, capacity))
    if k0 > n:
        return k0, None, None
    if packed > k0:  # a search would run: another packing may land lower
        filled = _reserving_fill_partitions(size, capacity)
        if len(filled) < len(packing):
            packing, packed = filled, allowed(len(filled))
    count, known, found_by = _search_count(size, work, capacity, k0, packed, step, packing, hint, hint_failed)
    if count > n:
        return count, None, None
    return count, known, found_by


def _chunked_search(
    size: np.ndarray, work: np.ndarray, capacity: int, chunks: int, min_count: int, step: int
) -> tuple[int, Optional[list[list[int]]]]:
    """The count search on :func:`seqbal.partition.chunks.deal_chunks`'s chunks against a
    packing of the whole input (:func:`_whole_packing`): where the packing is above the
    bound, the chunks are searched in turn (each its own search at ``min_count = step = 1``,
    probing first at its bound plus the mean gap of the chunks before it) while they can
    still need fewer parts than the packing, by a margin, and, past :data:`PROBE_CHUNKS`,
    while some chunk's try beat its own packing; if all of them were searched and need fewer,
    each is balanced at its own count and their parts put side by side; else, where only the
    seams lose (:func:`_seams_only`), the whole input is tried once at its bound; that try's
    partition where it works, else the packing, is the answer, balanced chunk by chunk
    (:func:`seqbal.partition.chunks.balanced_in_chunks`).
    A count below ``min_count`` or not a multiple of ``step`` is then raised by splitting the
    heaviest parts (:func:`split_bins_to_count`, never breaks the cap) and rebalancing."""
    # A packing of the whole input has no seams; the chunks are searched one after another
    # only while they can still need fewer parts than it (the parts they found so far plus
    # the plain bounds of the rest), so where the packing wins most searches are skipped.
    packing, lower = _whole_packing(size, capacity)
    at_bound = len(packing) <= lower
    dealt = deal_chunks(size, chunks)
    reported = [0]  # items reported to a progress watcher (seqbal.partition.progress)
    rest = [ceildiv(exact_total(size[members]), capacity) for members in dealt]
    found: list[tuple[int, Optional[list[list[int]]], Optional[_Try]]] = []
    needed = 0  # parts the chunks searched so far need
    for c, members in enumerate(dealt if not at_bound else []):
        if needed + sum(rest[c:]) >= len(packing):
            break
        if c >= PROBE_CHUNKS and (needed + sum(rest[c:]) + (needed - sum(rest[:c])) * (chunks - c) / c
                                  >= len(packing) - PROBE_MARGIN * (chunks - c)):
            break  # the chunks so far, each as far above its bound as they were, cannot win by a margin
        if c >= PROBE_CHUNKS and all(by is None and k > bound for (k, _, by), bound in zip(found, rest)):
            break  # no try beat a chunk's own packing, above its bound: the chunks only re-pack
        # Past the first chunk, each probes first where the ones before it landed.
        hint_gap = None if not c else round((needed - sum(rest[:c])) / c)
        found.append(_count_search(size[members], work[members], capacity, 1, 1, hint_gap))
        needed += found[-1][0]
        reported[0] += len(members) // 2  # progress: half a chunk's items for its search, half for its balance
        advance(len(members) // 2)
    skipped = sum(len(members) // 2 for members in dealt[len(found):])
    reported[0] += skipped
    advance(skipped)

    whole: Optional[_Try] = None  # the whole input's try at its lower bound, where it worked
    if (len(found) < chunks or needed >= len(packing)) and _seams_only(size, len(packing), lower, chunks, capacity):
        tried = _fit_in(size, work, capacity, lower)
        if tried.parts is not None:
            whole = tried

    def balanced(tokens: np.ndarray, workloads: np.ndarray, k: int, known) -> list[list[int]]:
        if k == len(tokens):  # one item per part: the only partition, nothing to balance
            chunk_parts = [[i] for i in range(k)]
        else:
            chunk_parts = _balance_at(tokens, workloads, capacity, k, known, whole, polish=CHUNK_POLISH, checked=True)
        reported[0] += len(tokens) // 2
        advance(len(tokens) // 2)
        return chunk_parts

    if whole is not None:  # the whole input's try, balanced chunk by chunk
        count = lower
        parts = balanced_in_chunks(size, work, whole.parts, chunks, balanced)
    elif len(found) < chunks or needed >= len(packing):  # the packing, balanced chunk by chunk
        count = len(packing)
        parts = balanced_in_chunks(size, work, packing, chunks, balanced)
    else:  # each chunk's partition balanced at its own count
        count, parts = needed, []
        for members, (k, known, found_by) in zip(dealt, found):
            parts.extend(in_chunk(members, _balanced(size[members], work[members], capacity, k, known, found_by,
                                                     polish=CHUNK_POLISH)))
            reported[0] += len(members) // 2
            advance(len(members) // 2)
    advance(len(size) - reported[0])  # the halves' rounding: every item reported once in all
    target = roundup_divisible(max(min_count, count), step)
    if target > len(size):
        return target, None
    if target > count:
        parts = rebalance_within_capacity(split_bins_to_count(parts, size, target, weights=work), size, work, capacity)
    return target, parts


def _whole_packing(size: np.ndarray, capacity: int) -> tuple[list[list[int]], int]:
    """A packing of the whole input and its lower bound (``ceildiv(total, cap)``, the stronger
    :func:`packing_lower_bound` only where the packing is above it).

    Where parts hold at least :data:`FILL_ALONE_ITEMS_PER_PART` items on average, the
    reserving fill alone: there best-fit decreasing misses the bound by a part or two where
    the fill meets it, and never packed fewer parts on the benchmark grid (10^6 samples at
    cap 32768: pareto 13,225 against 13,223, real_codealpaca 3,365 against 3,364, real_gsm8k
    5,726 against 5,724, real_qwen_rollouts 14,651 against 14,635; equal on real_math and
    real_alpaca_eval). Elsewhere the better of best-fit decreasing and the reserving fill,
    best-fit decreasing where they tie, the fill only where best-fit decreasing is above the
    bound (at bound nothing needs fewer parts). O(n log n)."""
    plain = ceildiv(exact_total(size), capacity)
    if len(size) >= FILL_ALONE_ITEMS_PER_PART * plain:
        packing = _reserving_fill_partitions(size, capacity)
    else:
        packing = _best_fit_decreasing(size, capacity)
    # At the bound nothing needs fewer parts (the stronger bound only where the plain one is below).
    lower = plain if len(packing) <= plain else _lower_bound(size, capacity)
    if len(packing) > lower and len(size) < FILL_ALONE_ITEMS_PER_PART * plain:
        filled = _reserving_fill_partitions(size, capacity)
        if len(filled) < len(packing):
            packing = filled
    return packing, lower


def _seams_only(size: np.ndarray, packed: int, lower: int, chunks: int, capacity: int) -> bool:
    """Whether a chunked search whose chunks do not beat the whole input's packing (``packed``
    parts) tries the whole input once at its lower bound (one feasibility try, as a search's):
    where the packing is within the seams' worth of the bound (at most one part per seam
    above it) and the items are small and many per part (each at most ``1 /``
    :data:`WHOLE_TRY_ITEM_FRACTION` of the cap, at least :data:`WHOLE_TRY_ITEMS_PER_PART` per
    part on average). There the chunks lose by their seams' rounding alone, and the try's
    swaps of small items fill the parts to the last tokens: real_qwen_rollouts at cap 32768,
    10^6 samples (68 per part, each under a tenth of the cap), lands on the bound, 14,633
    parts, against the reserving fill's 14,635 and the chunks' plain bounds' 14,663, for
    about half the plan's time. With fewer or larger items the try's repair is long and
    fails: lognormal at cap 32768 (26 per part, up to the cap) cost 1.5 times the plan's time,
    real_codealpaca at cap 4096 (37 per part, under a tenth) 1.5 times, for nothing. O(1)."""
    return (lower < packed <= lower + chunks - 1 and len(size) >= WHOLE_TRY_ITEMS_PER_PART * lower
            and WHOLE_TRY_ITEM_FRACTION * int(size.max()) <= capacity)


def _search_count(
    size: np.ndarray,
    work: np.ndarray,
    capacity: int,
    low: int,
    packed: int,
    step: int,
    packing: list[list[int]],
    hint: Optional[int] = None,
    hint_failed: bool = False,
) -> tuple[int, list[list[int]], Optional[_Try]]:
    """Smallest count in ``[low, packed]`` (multiples of ``step``) where a partition is known,
    with that partition (at most that many parts) and the try that made it at that count
    (``None`` when it is the packing). See :func:`smallest_feasible_partitions`.

    ``hint`` (the chunks of a chunked search: where the chunks before this one landed, as far
    above their bounds): probed first instead of the one-by-one counts and the one below the
    packing; where it works, the counts below it are tried downwards until one fails (two
    tries where the hint is right, against six to ten); where it fails, bisection goes on
    above it as usual. ``hint_failed``: the hint's try was made already and failed."""
    if low >= packed:
        return low, packing, None
    # Decided once, so every count of this search gets the same try: small inputs get every start.
    thorough = packed <= SMALL_COUNT and len(size) <= THOROUGH_ITEMS
    orders = (_descending(work), _descending(size))  # the same for every try
    failed, found, known, found_by = low - step, packed, packing, None  # the largest count known to fail; the smallest known to work
    if hint is not None and low <= hint < packed:
        tried = None if hint_failed else _fit_in(size, work, capacity, hint, thorough, orders)
        if tried is not None and tried.parts is not None:
            return _walk_down(size, work, capacity, hint - step, low, step, set(), thorough, orders,
                              (hint, tried.parts, tried))
        failed = hint
    # The first LINEAR_TRIES counts one by one (the answer is usually within a few of the
    # bound, and a try can fail just above a count where it works); then one step below the
    # packing, the count most likely to work; then bisection between the last failure and the
    # smallest success. Every probe is the same try, and a success at m settles every count
    # above m (split the partition), so the predicate searched is monotone by construction.
    # A stalled try ends the one-by-one tries (see STALLED_FRACTION); bisection may still
    # come back to their counts.
    probes = [low + i * step for i in range(LINEAR_TRIES)] + [packed - step] if hint is None else []
    stalled = False
    failures: set[int] = {failed} if hint is not None else set()  # counts whose try failed
    for count in probes:
        if not failed < count < found or (stalled and count != packed - step):
            continue
        tried = _fit_in(size, work, capacity, count, thorough, orders)
        if tried.parts is not None:
            found, known, found_by = count, tried.parts, tried
            break
        failed, stalled = count, tried.stalled
        failures.add(count)

    bisected = found - failed > step
    while found - failed > step:  # bisect (failed, found)
        middle = failed + (found - failed) // (2 * step) * step
        tried = _fit_in(size, work, capacity, middle, thorough, orders)
        if tried.parts is not None:
            found, known, found_by = middle, tried.parts, tried
        else:
            failed = middle
            failures.add(middle)
    if bisected:
        # The try is not monotone: it can work below a count where it failed (on rng(91) it
        # works at 89 and 90 and fails at 91, where bisection stops). So the counts below the
        # last failure are tried downwards, until one fails or was seen to fail.
        found, known, found_by = _walk_down(size, work, capacity, found - 2 * step, low, step, failures, thorough,
                                            orders, (found, known, found_by))
    return found, known, found_by


def _walk_down(
    size: np.ndarray, work: np.ndarray, capacity: int, count: int, low: int, step: int, failures: set[int],
    thorough: bool, orders: tuple[list[int], list[int]], best: tuple[int, list[list[int]], Optional[_Try]],
) -> tuple[int, list[list[int]], Optional[_Try]]:
    """``best`` (count, partition, try), lowered by trying ``count`` and the counts below it,
    ``step`` apart and not below ``low``, until a try fails or reaches a count in ``failures``."""
    while count >= low and count not in failures:
        tried = _fit_in(size, work, capacity, count, thorough, orders)
        if tried.parts is None:
            break
        best = (count, tried.parts, tried)
        count -= step
    return best
