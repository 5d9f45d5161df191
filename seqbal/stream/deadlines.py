"""A witness that every pending group can still leave by its deadline (``max_wait_steps``).

A ``micro_batches_per_step`` planner with ``max_wait_steps=w`` promises that a group added
before step ``b`` leaves by step ``b + w``. Counting groups (at most ``count = K x ranks`` a
step) is a sound way to keep that promise but a poor one when groups pack several to a
micro-batch: it forces the oldest groups in, one per micro-batch, whatever room they leave.
This module keeps a *witness* instead: a schedule of every pending group to a step no later
than its deadline and to one of that step's ``count`` micro-batches, each within the caps. A
step may then take any set of groups whose leftover still has a witness, found by repairing the
old one or packing afresh; where neither works, it takes the witness's own step (kept whole,
topped up with whatever else fits), and the witness's later steps remain a witness.

Why arrivals always fit: the witness spans the ``w + 1`` steps from now, ``(w + 1) x count``
micro-batches, every non-empty one holding at least one group; the planner admits at most
``(w + 1) x count`` pending groups, so there are at least as many empty micro-batches as
arrivals, each of them in a step no later than an arrival's deadline (``now + w``), and every
group fits a micro-batch alone.

A group's place is one int, ``step x count + micro_batch`` (its *slot*), per pending group in
the pool's order; it is part of the planner's state (checkpoints) and derived the same way on
every rank.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .fill import top_up_bins

__all__ = ["DeadlineWitness"]


class DeadlineWitness:
    """The witness schedule of a ``max_wait_steps`` planner (see the module docstring).

    Args:
        count: micro-batches a step (``K x ranks``).
        capacity: a micro-batch's cap under the cost model.
        wait: ``max_wait_steps``.
        padded: padded cost (``samples x longest``) instead of summed cost.
        max_samples: the cap on a micro-batch's samples, or None.

    Attributes:
        slots: one slot per pending group that has one, in pool order (groups arrived since the
            last :meth:`place_new` have none yet: they are the pool's tail).
    """

    def __init__(self, count: int, capacity: int, wait: int, *, padded: bool = False,
                 max_samples: Optional[int] = None) -> None:
        self.count = count
        self.capacity = capacity
        self.wait = wait
        self.padded = padded
        self.max_samples = max_samples
        self.slots = np.zeros(0, dtype=np.int64)

    # -- the micro-batches of a schedule ------------------------------------------------------

    def _loads(self, columns: dict[str, np.ndarray], slots: np.ndarray, groups: np.ndarray,
               first_step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Load, samples and longest of every micro-batch of the steps ``first_step`` to
        ``first_step + wait`` holding ``groups`` (pool positions) at ``slots``. O(p + w x count)."""
        size = (self.wait + 1) * self.count
        load, samples, longest = (np.zeros(size, dtype=np.int64) for _ in range(3))
        where = slots - first_step * self.count
        np.add.at(samples, where, columns["samples"][groups])
        np.maximum.at(longest, where, columns["longest"][groups])
        if self.padded:
            load = samples * longest
        else:
            np.add.at(load, where, columns["cost"][groups])
        return load, samples, longest

    def _first_fit(self, columns: dict[str, np.ndarray], groups: np.ndarray, first_step: int,
                   state: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Optional[np.ndarray]:
        """Slots for ``groups`` (pool positions, in deadline order), each in the first
        micro-batch of the steps ``first_step`` to its deadline with room (``state`` changes
        in place); None if one fits none. O(len(groups) x (w + 1) x count) NumPy work."""
        load, samples, longest = state
        out = np.empty(len(groups), dtype=np.int64)
        cost, sizes, tops, born = (columns[name][groups].tolist() for name in ("cost", "samples", "longest", "born"))
        limit = self.max_samples
        for i in range(len(groups)):
            end = (born[i] + self.wait - first_step + 1) * self.count  # the group's last step, exclusive
            if end <= 0:
                return None
            n = samples[:end] + sizes[i]
            if self.padded:
                fits = n * np.maximum(longest[:end], tops[i]) <= self.capacity
            else:
                fits = load[:end] + cost[i] <= self.capacity
            if limit is not None:
                fits &= n <= limit
            target = int(np.argmax(fits))
            if not fits[target]:
                return None
            samples[target] += sizes[i]
            longest[target] = max(int(longest[target]), tops[i])
            load[target] = samples[target] * longest[target] if self.padded else load[target] + cost[i]
            out[i] = first_step * self.count + target
        return out

    # -- keeping it -------------------------------------------------------------------------

    def place_new(self, columns: dict[str, np.ndarray], now: int) -> None:
        """Give the groups added since the last call (the pool's tail) slots from now on.

        Raises:
            RuntimeError: one fits nowhere: the admission bound should make that impossible.
        """
        placed, groups = len(self.slots), len(columns["samples"])
        if placed == groups:
            return
        state = self._loads(columns, self.slots, np.arange(placed), now)
        new = self._first_fit(columns, np.arange(placed, groups), now, state)
        if new is None:
            raise RuntimeError("internal error: an admitted group has no room before its deadline; please report")
        self.slots = np.concatenate([self.slots, new])

    def step_bins(self, now: int) -> list[list[int]]:
        """The witness's own step ``now``: ``count`` lists of pool positions."""
        bins: list[list[int]] = [[] for _ in range(self.count)]
        for g in np.nonzero(self.slots // self.count == now)[0].tolist():
            bins[int(self.slots[g]) % self.count].append(g)
        return bins

    def due_now(self, columns: dict[str, np.ndarray], now: int) -> int:
        """How many of the oldest groups must leave in step ``now``. O(p)."""
        return int(np.searchsorted(columns["born"] + self.wait, now, side="right"))

    def after_taking(self, columns: dict[str, np.ndarray], taken: list[int], now: int) -> Optional[np.ndarray]:
        """A witness from step ``now + 1`` for the groups left once step ``now`` takes
        ``taken`` (pool positions), as slots in the order of those left; None if neither a
        repair of this witness nor a fresh first-fit packing in deadline order finds one.
        O(p x (w + 1) x count) NumPy work at worst (the fresh packing)."""
        left = np.ones(len(columns["samples"]), dtype=bool)
        if taken:
            left[np.asarray(taken, dtype=np.int64)] = False
        kept = np.nonzero(left)[0]
        if not len(kept):
            return np.zeros(0, dtype=np.int64)
        slots = self.slots[kept]
        later = slots >= (now + 1) * self.count
        # a repair: the later steps as they are, this step's leftovers first-fit into them
        state = self._loads(columns, slots[later], kept[later], now + 1)
        moved = self._first_fit(columns, kept[~later], now + 1, state)
        if moved is not None:
            slots = slots.copy()
            slots[~later] = moved
            return slots
        state = self._loads(columns, slots[:0], kept[:0], now + 1)
        fresh = self._first_fit(columns, kept, now + 1, state)
        return fresh if fresh is not None else self._step_by_step(columns, kept, now + 1)

    def _step_by_step(self, columns: dict[str, np.ndarray], groups: np.ndarray, first_step: int) -> Optional[np.ndarray]:
        """Slots for ``groups`` (pool positions) packed a step at a time from ``first_step``:
        the groups whose deadline is that step, then as many others as fit (decreasing cost,
        best fit: the fullest fill), until none is left; None if a step cannot hold the groups
        due in it. Finds witnesses that the first fit in deadline order misses where groups
        pack well only in decreasing size. O(w x p log p) on ``p`` groups."""
        out = np.empty(len(columns["samples"]), dtype=np.int64)
        left = np.asarray(groups, dtype=np.int64)
        deadline = columns["born"] + self.wait
        step = first_step
        while len(left):
            due = np.nonzero(deadline[left] <= step)[0].tolist()
            bins = top_up_bins(columns["cost"][left], columns["samples"][left], columns["longest"][left], self.count,
                               self.capacity, must=due, padded=self.padded, max_samples=self.max_samples)
            if bins is None:
                return None
            placed = np.zeros(len(left), dtype=bool)
            for b, members in enumerate(bins):
                if members:
                    out[left[members]] = step * self.count + b
                    placed[members] = True
            left = left[~placed]
            step += 1
        return out[np.asarray(groups, dtype=np.int64)]

    def take(self, slots: np.ndarray) -> None:
        """The step was taken: ``slots`` (from :meth:`after_taking`, or this witness's own less
        its step's groups) become the witness."""
        self.slots = slots

    # -- checkpoints ------------------------------------------------------------------------

    def check(self, columns: dict[str, np.ndarray], slots: np.ndarray, now: int) -> Optional[str]:
        """Why ``slots`` (for the pool's first ``len(slots)`` groups) is not a witness at step
        ``now``, or None: every slot in a step from ``now`` to its group's deadline, every
        micro-batch within the caps. O(p + w x count)."""
        groups = len(columns["samples"])
        if len(slots) > groups:
            return f"has {len(slots)} entries, but the pool holds {groups} groups"
        if not len(slots):
            return None
        born = columns["born"][:len(slots)]
        step = slots // self.count
        late = np.nonzero((step < now) | (step > born + self.wait))[0]
        if len(late):
            g = int(late[0])
            return (f"puts group {g} (arrived before step {int(born[g])}) in step {int(step[g])}, outside steps "
                    f"{now} to {int(born[g]) + self.wait} (the steps taken to its max_wait_steps deadline)")
        load, samples, _ = self._loads(columns, slots, np.arange(len(slots)), now)
        over = load > self.capacity
        if self.max_samples is not None:
            over |= samples > self.max_samples
        over = np.nonzero(over)[0]
        if len(over):
            slot = int(over[0]) + now * self.count
            return (f"fills micro-batch {slot % self.count} of step {slot // self.count} over the cap "
                    f"({int(load[over[0]])} > {self.capacity}, or over the sample cap)")
        return None
