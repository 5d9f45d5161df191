"""One checker for every promise of :class:`seqbal.StepPlanner`, shared by the example, property
and distributed tests: each test is a new stream of adds and steps, not a new copy of the checks.

:class:`Tracker` mirrors what was added (lengths, groups, the step each sample arrived before)
and checks every step the planner returns against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from seqbal.cost import CostModel, as_cost_model


@dataclass
class Tracker:
    """What a planner was given, and the checks of what it returns.

    Attributes:
        cap, ranks, k, s, cost, max_samples, wait, oldest_first: the planner's settings.
        length, group, born: per pending or emitted sample index: its length, its group key and
            the number of steps taken before it was added.
        order: group keys in arrival order (pending ones).
        emitted: every index emitted so far.
    """

    cap: int
    ranks: int
    k: Optional[int] = None
    s: Optional[int] = None
    cost: Any = None
    max_samples: Optional[int] = None
    wait: Optional[int] = None
    oldest_first: bool = False
    length: dict[int, int] = field(default_factory=dict)
    group: dict[int, tuple] = field(default_factory=dict)
    born: dict[int, int] = field(default_factory=dict)
    members: dict[tuple, list[int]] = field(default_factory=dict)
    order: list[tuple] = field(default_factory=list)
    emitted: set[int] = field(default_factory=set)
    steps: int = 0
    adds: int = 0

    def __post_init__(self) -> None:
        self.model: CostModel = as_cost_model(self.cost)

    def added(self, indices, lengths, groups=None) -> None:
        """Record an add the planner accepted (call only after it returned)."""
        self.adds += 1
        groups = list(range(len(indices))) if groups is None else list(groups)
        for i, n, g in zip(indices, lengths, groups):
            key = (self.adds, g)
            if key not in self.members:
                self.members[key] = []
                self.order.append(key)
            self.members[key].append(int(i))
            self.length[int(i)] = int(n)
            self.group[int(i)] = key
            self.born[int(i)] = self.steps

    @property
    def pending(self) -> int:
        return sum(len(self.members[key]) for key in self.order)

    def check_step(self, step: Optional[list], flush: bool) -> None:
        """Every promise about one ``next_step(flush)`` result; updates the mirror."""
        pending_groups = len(self.order)
        if step is None:
            assert not flush or pending_groups == 0, "a flush with samples pending returned None"
            if self.k is not None:
                assert pending_groups < self.k * self.ranks or pending_groups == 0, (
                    f"None with {pending_groups} groups pending, enough for a step of {self.k} x {self.ranks}")
            elif self.pending >= self.s and len({len(self.members[g]) for g in self.order}) == 1 \
                    and self.s % len(self.members[self.order[0]]) == 0:
                raise AssertionError(f"None with {self.pending} samples of equal groups pending, S={self.s}")
            return
        assert len(step) == self.ranks, f"{len(step)} ranks, expected {self.ranks}"
        counts = {len(rank) for rank in step}
        assert len(counts) == 1, f"ranks run different counts: {[len(r) for r in step]}"
        if self.k is not None:
            assert counts == {self.k}, f"{counts} micro-batches per rank, expected K={self.k}"
        seen: list[int] = []
        for r, rank in enumerate(step):
            empty_seen = False
            for m, mb in enumerate(rank):
                assert mb == sorted(mb), f"rank {r} micro-batch {m} not ascending: {mb}"
                if not mb:
                    empty_seen = True
                    continue
                assert not empty_seen, f"rank {r}: a dummy before micro-batch {m}"
                cost = self.model.cost([self.length[i] for i in mb])
                assert cost <= self.cap, f"rank {r} micro-batch {m} costs {cost} > cap {self.cap}"
                if self.max_samples is not None:
                    assert len(mb) <= self.max_samples, f"{len(mb)} samples > {self.max_samples}"
                seen.extend(mb)
        assert len(seen) == len(set(seen)), "a sample twice in one step"
        taken = set(seen)
        assert not taken & self.emitted, f"emitted again: {sorted(taken & self.emitted)[:5]}"
        assert taken <= set(self.length), f"never added: {sorted(taken - set(self.length))[:5]}"
        where = {i: (r, m) for r, rank in enumerate(step) for m, mb in enumerate(rank) for i in mb}
        taken_groups = []
        for key in self.order:
            inside = [i in taken for i in self.members[key]]
            if any(inside):
                assert all(inside), f"group {key} split across steps"
                assert len({where[i] for i in self.members[key]}) == 1, f"group {key} split across micro-batches"
                taken_groups.append(key)
        has_dummy = any(not mb for rank in step for mb in rank)
        if self.k is not None:
            assert flush or not has_dummy, "a dummy micro-batch outside a flush"
            if has_dummy:
                assert len(taken_groups) < self.k * self.ranks, "dummies although the groups could fill every micro-batch"
            # a pool that cannot fill the step leaves whole; else with oldest_first the K x ranks
            # oldest groups, or without max_wait_steps the oldest group once it has waited
            # OLDEST_PATIENCE steps (no group waits for ever); max_wait_steps is checked below
            from seqbal.stream.planner import OLDEST_PATIENCE  # the default of oldest_patience

            must = self.order
            if len(self.order) > self.k * self.ranks and self.oldest_first:
                must = self.order[:self.k * self.ranks]
            elif len(self.order) > self.k * self.ranks:
                oldest = self.order[0]
                patient = self.wait is None and self.steps - self.born[self.members[oldest][0]] >= OLDEST_PATIENCE
                must = self.order[:1] if patient else []
            missing = [key for key in must if key not in taken_groups]
            assert not missing, f"oldest groups left behind: {missing[:3]}"
        else:
            if not flush:
                assert len(seen) == self.s, f"{len(seen)} samples, expected S={self.s}"
            else:
                assert len(seen) == self.s or len(seen) == self.pending or len(seen) < self.s
            if has_dummy:
                assert len(taken_groups) < self.ranks * len(step[0]), "dummies although the groups fill every slot"
            sizes = {len(self.members[key]) for key in self.order}
            if len(sizes) == 1 and self.s % sizes.pop() == 0:  # equal groups: exactly the oldest S samples
                expect = self.order[:len(taken_groups)]
                assert taken_groups == expect, "not the oldest groups"
        if self.wait is not None:
            for key in self.order:
                if key not in taken_groups:
                    i = self.members[key][0]
                    assert self.steps < self.born[i] + self.wait, (
                        f"group {key} (added before step {self.born[i]}) still pending after step {self.steps}, "
                        f"max_wait_steps={self.wait}")
        self.emitted |= taken
        self.order = [key for key in self.order if key not in set(taken_groups)]
        self.steps += 1
