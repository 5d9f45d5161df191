"""Mutable parts for the local searches: sums kept up to date, parts sorted by room and workload.

The repair and the rebalance each ask, at every step, for "the fullest part with room for this
item", "the parts with most room" or "the heaviest and lightest parts". Keeping the parts in
sorted blocks (:class:`_SortedPairs`) makes each a binary search, O(log k + block), instead
of an O(k) NumPy scan per step, which at 10^5 parts dominated the repair. The repair's bins
(:class:`_RankedBins`) also keep each part's members sorted, and only once a step looks at a
part, so a try that fails at once pays for a few parts only. Part sums are added in the
interpreter up to :data:`PYTHON_SUMS_ITEMS` items and in NumPy above: at a few hundred items
NumPy's fixed cost per call is the larger part of a sum, and a small plan sums parts a dozen
times.
"""

from __future__ import annotations

import bisect
from typing import Optional, Sequence

import numpy as np

from .parts import _part_sums

def _rank_position(keys: list[int], items: list[int], key: int, item: int) -> int:
    """Where ``(key, item)`` stands in parallel lists sorted by ``(key, item)``: the first
    position not before it, so its index if present, its insertion point if not.
    O(log len + ties)."""
    position = bisect.bisect_left(keys, key)
    while position < len(keys) and keys[position] == key and items[position] < item:
        position += 1
    return position


#: Up to this many items, part sums are added up in the interpreter from the value lists the
#: bins keep anyway: NumPy's fixed cost per call (about 20 us) is then the larger part of the
#: sum, and a small plan builds bins a few times per count it tries.
PYTHON_SUMS_ITEMS = 256


def _sums(values: np.ndarray, members: Sequence[Sequence[int]], value_list: Optional[list[int]] = None) -> list[int]:
    """Exact sum of ``values`` (int64) over each part, as Python ints: added in the interpreter
    up to :data:`PYTHON_SUMS_ITEMS` items (from ``value_list``, ``values.tolist()``, where the
    caller keeps one), else one NumPy pass. O(n)."""
    if len(values) <= PYTHON_SUMS_ITEMS:
        get = (values.tolist() if value_list is None else value_list).__getitem__
        return [sum(map(get, part)) for part in members]
    return _part_sums(values, members).tolist()


class _SortedPairs:
    """A sorted multiset of ``(key, part)`` pairs in blocks of a few hundred: add, remove and
    the searches below cost O(log k + block) instead of the O(k) shift of one flat list, which
    at 10^5 parts dominated the repair."""

    _BLOCK = 256

    def __init__(self, pairs) -> None:
        ordered = sorted(pairs)
        self.blocks = [ordered[i:i + self._BLOCK] for i in range(0, len(ordered), self._BLOCK)]
        self.maxes = [block[-1] for block in self.blocks]

    def add(self, pair: tuple[int, int]) -> None:
        if not self.blocks:
            self.blocks, self.maxes = [[pair]], [pair]
            return
        i = min(bisect.bisect_left(self.maxes, pair), len(self.blocks) - 1)
        block = self.blocks[i]
        bisect.insort(block, pair)
        self.maxes[i] = block[-1]
        if len(block) > 2 * self._BLOCK:
            self.blocks[i:i + 1] = [block[:self._BLOCK], block[self._BLOCK:]]
            self.maxes[i:i + 1] = [block[self._BLOCK - 1], block[-1]]

    def remove(self, pair: tuple[int, int]) -> None:
        i = bisect.bisect_left(self.maxes, pair)
        block = self.blocks[i]
        del block[bisect.bisect_left(block, pair)]
        if block:
            self.maxes[i] = block[-1]
        else:
            del self.blocks[i], self.maxes[i]

    def replace(self, old: tuple[int, int], new: tuple[int, int]) -> None:
        """:meth:`remove` ``old`` and :meth:`add` ``new``; in one block (up to 512 parts, every
        small plan) without the block bookkeeping, which is then most of the cost."""
        if len(self.blocks) != 1:
            self.remove(old)
            self.add(new)
            return
        block = self.blocks[0]
        del block[bisect.bisect_left(block, old)]
        bisect.insort(block, new)
        self.maxes[0] = block[-1]

    def last(self) -> tuple[int, int]:
        return self.maxes[-1]

    def first_at_least(self, pair: tuple[int, int]) -> Optional[tuple[int, int]]:
        i = bisect.bisect_left(self.maxes, pair)
        if i == len(self.blocks):
            return None
        block = self.blocks[i]
        return block[bisect.bisect_left(block, pair)]

    def last_below(self, pair: tuple[int, int]) -> Optional[tuple[int, int]]:
        """The largest entry smaller than ``pair``, or None."""
        i = bisect.bisect_left(self.maxes, pair)
        if i == len(self.blocks):
            return self.maxes[-1] if self.blocks else None
        j = bisect.bisect_left(self.blocks[i], pair)
        if j:
            return self.blocks[i][j - 1]
        return self.maxes[i - 1] if i else None

    def largest(self, count: int) -> list[tuple[int, int]]:
        """The ``count`` largest entries, descending."""
        out: list[tuple[int, int]] = []
        for block in reversed(self.blocks):
            out.extend(block[:-(count - len(out)) - 1:-1])  # the block's last entries, reversed
            if len(out) >= count:
                break
        return out

    def smallest(self, count: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for block in self.blocks:
            out.extend(block[:count - len(out)])
            if len(out) >= count:
                break
        return out


class _Bins:
    """Mutable parts with their token and workload sums, for the local searches below.

    Besides the sums it keeps the parts sorted (:class:`_SortedPairs`) by free room for the
    repair (``by_work=False``) or by workload for the rebalance (``by_work=True``), so "the
    fullest part with room for this item", "the parts with most room" and "the heaviest and
    the lightest parts" are binary searches instead of O(k) NumPy scans per step.
    """

    def __init__(
        self,
        parts: Sequence[Sequence[int]],
        tokens: np.ndarray,
        workloads: np.ndarray,
        capacity: int,
        *,
        by_work: bool,
        work_sums: Optional[list[int]] = None,
        token_sums: Optional[list[int]] = None,
    ) -> None:
        """``work_sums``, ``token_sums``: the parts' sums where the caller has them (copied)."""
        self.tokens_of = tokens.tolist()
        self.work_of = self.tokens_of if workloads is tokens else workloads.tolist()
        self.capacity = capacity
        self.members: list[list[int]] = [list(p) for p in parts]
        self.tokens: list[int] = (
            list(token_sums) if token_sums is not None else _sums(tokens, self.members, self.tokens_of))
        if work_sums is not None:
            self.work: list[int] = list(work_sums)
        else:
            self.work = self.tokens.copy() if workloads is tokens else _sums(workloads, self.members, self.work_of)
        # Keyed (room, -part): the end of the list is the most room, lowest part first among equal
        # rooms, the order of a stable sort by descending room (which the repair's swaps follow).
        # Each search keeps only the order it reads: the repair by room, the rebalance by workload.
        self.by_room = None if by_work else _SortedPairs(self._room_pairs())
        self.by_work = _SortedPairs(zip(self.work, range(len(self.work)))) if by_work else None
        #: A part's members as (workloads ascending, their tokens, items) lists, built on first use
        #: and kept in order by moves and swaps: the rebalance pairs the same light parts with one
        #: heavy part after another.
        self.ranked_by_work: dict[int, tuple[list[int], list[int], list[int]]] = {}

    def _room_pairs(self) -> list[tuple[int, int]]:
        return list(zip([self.capacity - t for t in self.tokens], range(0, -len(self.tokens), -1)))

    def _add(self, part: int, tokens: int, work: int) -> None:
        before_tokens, before_work = self.tokens[part], self.work[part]
        self.tokens[part] = before_tokens + tokens
        self.work[part] = before_work + work
        if self.by_room is not None:
            room = self.capacity - before_tokens
            self.by_room.replace((room, -part), (room - tokens, -part))
        if self.by_work is not None:
            self.by_work.replace((before_work, part), (before_work + work, part))

    def room(self, part: int) -> int:
        return self.capacity - self.tokens[part]

    def work_ranked(self, part: int) -> tuple[list[int], list[int], list[int]]:
        """The part's member workloads ascending (ties by item), their tokens and the items, in
        that order."""
        ranked = self.ranked_by_work.get(part)
        if ranked is None:
            work_of = self.work_of
            items = sorted(self.members[part])
            items.sort(key=work_of.__getitem__)  # stable: by workload, ties by item
            ranked = self.ranked_by_work[part] = ([work_of[i] for i in items], [self.tokens_of[i] for i in items], items)
        return ranked

    def _unrank(self, part: int, item: int) -> None:
        """Take ``item`` out of the part's :meth:`work_ranked` lists, if they are kept."""
        ranked = self.ranked_by_work.get(part)
        if ranked is not None:
            works, tokens, items = ranked
            position = _rank_position(works, items, self.work_of[item], item)
            del works[position], tokens[position], items[position]

    def _rank(self, part: int, item: int) -> None:
        """Put ``item`` into the part's :meth:`work_ranked` lists, if they are kept, in order."""
        ranked = self.ranked_by_work.get(part)
        if ranked is not None:
            works, tokens, items = ranked
            work = self.work_of[item]
            position = _rank_position(works, items, work, item)
            works.insert(position, work)
            tokens.insert(position, self.tokens_of[item])
            items.insert(position, item)

    def move(self, item: int, source: int, target: int) -> None:
        self._unrank(source, item)
        self._rank(target, item)
        self.members[source].remove(item)
        self.members[target].append(item)
        self._add(source, -self.tokens_of[item], -self.work_of[item])
        self._add(target, self.tokens_of[item], self.work_of[item])

    def swap(self, item_a: int, bin_a: int, item_b: int, bin_b: int) -> None:
        """Trade ``item_a`` of ``bin_a`` for ``item_b`` of ``bin_b`` (members as two moves would
        leave them; each part's sorted keys updated once)."""
        work_of, tokens_of, kept = self.work_of, self.tokens_of, self.ranked_by_work
        for part, out, into in ((bin_a, item_a, item_b), (bin_b, item_b, item_a)):  # _unrank, _rank in line
            ranked = kept.get(part)
            if ranked is not None:
                works, tokens, items = ranked
                position = _rank_position(works, items, work_of[out], out)
                del works[position], tokens[position], items[position]
                work = work_of[into]
                position = _rank_position(works, items, work, into)
                works.insert(position, work)
                tokens.insert(position, tokens_of[into])
                items.insert(position, into)
        members_a, members_b = self.members[bin_a], self.members[bin_b]
        members_a.remove(item_a)
        members_b.append(item_a)
        members_b.remove(item_b)
        members_a.append(item_b)
        tokens = self.tokens_of[item_b] - self.tokens_of[item_a]
        work = self.work_of[item_b] - self.work_of[item_a]
        self._add(bin_a, tokens, work)
        self._add(bin_b, -tokens, -work)

    def result(self) -> list[list[int]]:
        return [sorted(p) for p in self.members]


class _RankedBins(_Bins):
    """:class:`_Bins` on tokens alone (the repair), where a part's members, once a step looks at
    them, are kept sorted by ``(tokens, item)`` as two parallel lists (sizes and items), so
    later steps binary-search them without sorting. Parts are sorted on first use: a try that
    fails at once sorts a few."""

    def __init__(
        self, parts: Sequence[Sequence[int]], tokens: np.ndarray, capacity: int, token_sums: Optional[list[int]] = None
    ) -> None:
        super().__init__(parts, tokens, tokens, capacity, by_work=False, token_sums=token_sums)
        self._sizes: list[Optional[list[int]]] = [None] * len(self.members)
        self._items: list[Optional[list[int]]] = [None] * len(self.members)

    def _room_pairs(self) -> list[tuple[int, int]]:
        # Parts over the capacity are never a target, so ``by_room`` holds only the others: a
        # step then updates one entry (the target's) instead of two.
        return [(self.capacity - t, -part) for part, t in enumerate(self.tokens) if t <= self.capacity]

    def _add(self, part: int, tokens: int, work: int) -> None:
        room = self.capacity - self.tokens[part]
        self.tokens[part] += tokens
        if room >= 0 and room - tokens >= 0:
            self.by_room.replace((room, -part), (room - tokens, -part))
        elif room >= 0:
            self.by_room.remove((room, -part))
        elif room - tokens >= 0:
            self.by_room.add((room - tokens, -part))

    def ranked(self, part: int) -> tuple[list[int], list[int]]:
        """The part's member sizes, ascending, and its items in the same order (ties by index);
        the lists themselves, kept sorted by :meth:`move` and :meth:`swap`."""
        sizes = self._sizes[part]
        if sizes is None:
            sizes_of = self.tokens_of
            items = sorted(self.members[part])
            items.sort(key=sizes_of.__getitem__)  # stable: by size, ties by item
            sizes = self._sizes[part] = [sizes_of[i] for i in items]
            self._items[part] = items
        return sizes, self._items[part]

    def _take(self, part: int, item: int) -> None:
        sizes, items = self.ranked(part)
        position = _rank_position(sizes, items, self.tokens_of[item], item)
        del sizes[position], items[position]

    def _put(self, part: int, item: int) -> None:
        sizes, items = self.ranked(part)
        size = self.tokens_of[item]
        position = _rank_position(sizes, items, size, item)
        sizes.insert(position, size)
        items.insert(position, item)

    def move(self, item: int, source: int, target: int) -> None:
        self._take(source, item)
        self._put(target, item)
        self._add(source, -self.tokens_of[item], 0)
        self._add(target, self.tokens_of[item], 0)

    def swap(self, item_a: int, bin_a: int, item_b: int, bin_b: int) -> None:
        for part, out, into in ((bin_a, item_a, item_b), (bin_b, item_b, item_a)):
            self._take(part, out)
            self._put(part, into)
        shift = self.tokens_of[item_b] - self.tokens_of[item_a]
        self._add(bin_a, shift, 0)
        self._add(bin_b, -shift, 0)

    def size(self, part: int) -> int:
        items = self._items[part]
        return len(self.members[part]) if items is None else len(items)

    def result(self) -> list[list[int]]:
        return [sorted(members if items is None else items) for members, items in zip(self.members, self._items)]
