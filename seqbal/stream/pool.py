"""The pending pool of a step planner: whole groups in arrival order, as NumPy arrays.

Arrivals are checked completely before anything changes (:meth:`Pool.prepare` returns the
checked groups, :meth:`Pool.commit` appends them), so a refused :meth:`add` leaves the pool as
it was: nothing already added is lost. Groups are kept group-major (a group's samples
contiguous) with per-group columns (cost alone, samples, longest, workload, the step it arrived
before), so that choosing a step works on whole-pool vectors, and taking a step compacts every
column with one boolean mask. New arrivals are buffered as chunks and joined once per step,
so ``n`` small adds cost O(n) in total, not O(n * pool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Optional, Sequence

import numpy as np

from ..cost import CostModel
from ..validation import group_keys, int_array
from ..workload import WorkloadFn, plan_workloads

#: Per-group columns, in arrival order.
GROUP_COLUMNS = ("cost", "tokens", "samples", "longest", "work", "born")


@dataclass(frozen=True)
class Arrivals:
    """Checked arrivals, group-major, ready to :meth:`Pool.commit`.

    Attributes:
        indices: the samples' indices, a group's samples contiguous, in order of first
            appearance of each group (and of the samples inside it).
        lengths: their effective lengths.
        columns: each of :data:`GROUP_COLUMNS` but ``born``, one entry per group.
    """

    indices: np.ndarray
    lengths: np.ndarray
    columns: dict[str, np.ndarray]

    @property
    def groups(self) -> int:
        return len(self.columns["samples"])


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


class Pool:
    """Pending groups in arrival order (see the module docstring).

    Args:
        max_token_len: the cap every group must fit alone.
        cost: the cost model the cap applies to.
        max_samples: the cap on a micro-batch's samples (a group must fit it), or None.
        max_group_samples: the most samples a group may have (``samples_per_step``), or None.
        workload_fn: lengths -> workloads a group's ``work`` sums (None: the default model).
    """

    def __init__(self, max_token_len: int, cost: CostModel, max_samples: Optional[int],
                 max_group_samples: Optional[int], workload_fn: Optional[WorkloadFn] = None) -> None:
        self.max_token_len = max_token_len
        self.workload_fn = workload_fn
        self.cost_model = cost
        self.capacity = cost.sample_capacity(max_token_len)
        self.max_samples = max_samples
        self.max_group_samples = max_group_samples
        self.indices, self.lengths = _empty(), _empty()
        self.columns = {name: _empty() for name in GROUP_COLUMNS}
        self._chunks: list[tuple[Arrivals, int]] = []
        self._ids: set[int] = set()
        self._groups = 0

    # -- reading ------------------------------------------------------------------------------

    @property
    def samples(self) -> int:
        """Samples pending. O(1) amortised."""
        return len(self._ids)

    @property
    def group_count(self) -> int:
        """Groups pending. O(1)."""
        return self._groups

    def first_group_size(self) -> Optional[int]:
        """Samples of the oldest pending group, None if none. O(1)."""
        if len(self.columns["samples"]):
            return int(self.columns["samples"][0])
        return int(self._chunks[0][0].columns["samples"][0]) if self._chunks else None

    def consolidate(self) -> None:
        """Join the buffered arrivals into the columns. O(pool) once per step."""
        if not self._chunks:
            return
        self.indices = np.concatenate([self.indices] + [a.indices for a, _ in self._chunks])
        self.lengths = np.concatenate([self.lengths] + [a.lengths for a, _ in self._chunks])
        for name in GROUP_COLUMNS:
            parts = [self.columns[name]]
            for arrivals, born in self._chunks:
                parts.append(np.full(arrivals.groups, born, dtype=np.int64) if name == "born" else arrivals.columns[name])
            self.columns[name] = np.concatenate(parts)
        self._chunks = []

    def offsets(self) -> np.ndarray:
        """Start of every group's samples in :attr:`indices` (consolidated first)."""
        self.consolidate()
        samples = self.columns["samples"]
        return np.cumsum(samples) - samples

    # -- arriving -----------------------------------------------------------------------------

    def prepare(self, indices: Any, lengths: Any, groups: Optional[Sequence[Hashable]] = None,
                also_taken: Optional[set[int]] = None, *, pending: bool = True) -> Arrivals:
        """Check arrivals against the caps and the pending indices; change nothing.

        Args:
            indices: a unique int per sample (any ints: dataset rows, rollout ids).
            lengths: each sample's effective length.
            groups: a group id per sample, or None (a group per sample). A group's samples
                arrive in one call: equal ids in different calls are different groups.
            also_taken: more indices that count as pending (arrivals gathered from other ranks
                in the same step).
            pending: False: the indices are not checked against the pending ones (a state
                that would replace them).

        Raises:
            ValueError: mismatched lengths, a non-int index, a negative length, an index
                already pending or repeated, a sample or group over the cap, a group of more
                samples than ``max_samples_per_micro_batch`` (or ``samples_per_step``).

        Complexity: O(n) for ``n`` arrivals.
        """
        index_array = int_array(indices, "indices", integral_floats=False, negative=True, sums=False)
        length_array = int_array(lengths, "lengths", samples=True, integral_floats=False)
        n = len(index_array)
        if len(length_array) != n:
            raise ValueError(f"indices has {n} entries but lengths has {len(length_array)}")
        if groups is not None:
            groups = group_keys(groups, "groups")  # tensors and arrays: grouped by value
            if len(groups) != n:
                raise ValueError(f"groups has {len(groups)} entries but indices has {n}")
        values = index_array.tolist()
        if len(set(values)) != n:
            seen: set[int] = set()
            repeated = next(v for v in values if v in seen or seen.add(v))  # type: ignore[func-returns-value]
            raise ValueError(f"index {repeated} appears more than once in this add")
        taken = self._ids if pending else set()
        clash = next((v for v in values if v in taken or (also_taken is not None and v in also_taken)), None)
        if clash is not None:
            raise ValueError(f"index {clash} is already pending; every pending sample needs its own index")
        # group-major order: groups by first appearance, samples in order inside each
        if groups is None:
            order = np.arange(n, dtype=np.int64)
            sizes = np.ones(n, dtype=np.int64)
            names: list[Hashable] = values
        else:
            members: dict[Hashable, list[int]] = {}
            for position, gid in enumerate(groups):
                members.setdefault(gid, []).append(position)
            order = np.fromiter((p for m in members.values() for p in m), dtype=np.int64, count=n)
            sizes = np.fromiter(map(len, members.values()), dtype=np.int64, count=len(members))
            names = list(members)
        index_array, length_array = index_array[order], length_array[order]
        rounded = self.cost_model.rounded(length_array)
        # What each sample adds to a micro-batch's cost: its rounded length, or under a memory
        # cost its predicted bytes (the cap is then in bytes); padded cost is samples x longest.
        sample_cost = rounded if self.cost_model.padded else self.cost_model.sample_costs(length_array)
        under = "" if self.cost_model.is_default else f" under the {self.cost_model}"
        over = np.nonzero(sample_cost > self.capacity)[0]
        if len(over):
            i = int(over[0])
            costs = ("" if self.cost_model.memory is None
                     else f" (alone, a micro-batch of {self.cost_model.cost([int(length_array[i])])})")
            raise ValueError(
                f"sample {int(index_array[i])} has {int(length_array[i])} tokens{under}{costs}, which exceeds "
                f"max_token_len={self.max_token_len} ({len(over)} sample(s) of this add over the cap); nothing "
                f"of this add was added"
            )
        starts = np.cumsum(sizes) - sizes
        tokens = np.add.reduceat(sample_cost, starts) if n else _empty()  # bytes under a memory cost
        longest = np.maximum.reduceat(rounded, starts) if n else _empty()
        work = np.add.reduceat(plan_workloads(rounded, self.workload_fn), starts) if n else _empty()
        if self.cost_model.padded:
            cost = sizes * longest
            capacity = self.max_token_len
        else:
            cost = tokens
            capacity = self.cost_model.token_capacity(self.max_token_len)
        over = np.nonzero(cost > capacity)[0]
        if len(over):
            g = int(over[0])
            group = index_array[starts[g]:starts[g] + sizes[g]].tolist()
            raise ValueError(
                f"group exceeds max_token_len: group {names[g]!r} (indices {group}) costs {int(cost[g])} "
                f"tokens{under} > max_token_len={self.max_token_len}; nothing of this add was added"
            )
        for cap, what in ((self.max_samples, "max_samples_per_micro_batch"), (self.max_group_samples, "samples_per_step")):
            if cap is not None and n and int(sizes.max()) > cap:
                g = int(np.argmax(sizes))
                raise ValueError(
                    f"group {names[g]!r} has {int(sizes[g])} samples, which exceeds {what}={cap}: a group is "
                    f"never split; nothing of this add was added"
                )
        columns = {"cost": cost.astype(np.int64), "tokens": tokens.astype(np.int64), "samples": sizes,
                   "longest": longest.astype(np.int64), "work": work.astype(np.int64)}
        return Arrivals(index_array, length_array, columns)

    def commit(self, arrivals: Arrivals, born: int) -> None:
        """Append checked arrivals, stamped with the step they arrived before. O(n)."""
        if arrivals.groups:
            self._chunks.append((arrivals, born))
            self._groups += arrivals.groups
            self._ids.update(arrivals.indices.tolist())

    # -- leaving ------------------------------------------------------------------------------

    def take(self, positions: Sequence[int]) -> list[np.ndarray]:
        """Remove the groups at ``positions`` (consolidated positions); return each one's
        sample indices, in the order of ``positions``. O(pool)."""
        self.consolidate()
        offsets = self.offsets()
        samples = self.columns["samples"]
        before = self.indices  # the views below stay valid: the columns are replaced, not changed
        positions = np.asarray(positions, dtype=np.int64)
        taken = [before[start:start + size] for start, size in zip(offsets[positions].tolist(), samples[positions].tolist())]
        keep_group = np.ones(len(samples), dtype=bool)
        keep_group[np.asarray(positions, dtype=np.int64)] = False
        keep_sample = np.repeat(keep_group, samples)
        self._ids.difference_update(before[~keep_sample].tolist())
        self.indices, self.lengths = before[keep_sample], self.lengths[keep_sample]
        for name in GROUP_COLUMNS:
            self.columns[name] = self.columns[name][keep_group]
        self._groups -= len(taken)
        return taken

    # -- state --------------------------------------------------------------------------------

    def state(self) -> dict[str, list[int]]:
        """Everything pending, as plain lists (a checkpoint)."""
        self.consolidate()
        out = {"indices": self.indices.tolist(), "lengths": self.lengths.tolist()}
        out.update({name: self.columns[name].tolist() for name in GROUP_COLUMNS})
        return out

    def load(self, state: Any, key: str = "state['pool']") -> None:
        """Restore :meth:`state`'s output exactly, after checking that it keeps this pool's
        promises: every key present and a list of ints, the columns as long as the groups, the
        groups' samples adding up to the samples, indices unique, every group within the caps
        (the checks of an add), and the derived columns those of its samples under this pool's
        cost model. A ``ValueError`` naming the key (``state['pool']['cost']``) otherwise, and
        the pool unchanged. O(pool)."""
        if not isinstance(state, dict):
            raise ValueError(f"{key} must be a dict of lists ({self.state.__qualname__}'s output), got "
                             f"{type(state).__name__}")
        arrays = {}
        for name in ("indices", "lengths", *GROUP_COLUMNS):
            if name not in state:
                raise ValueError(f"{key} has no {name!r}: not a pool state")
            try:
                arrays[name] = int_array(state[name], f"{key}[{name!r}]", integral_floats=False, negative=True,
                                         sums=False)
            except ValueError as error:
                raise ValueError(str(error)) from None
        n, samples = len(arrays["indices"]), arrays["samples"]
        for name in ("lengths", *GROUP_COLUMNS):
            expected = n if name == "lengths" else len(samples)
            if len(arrays[name]) != expected:
                raise ValueError(f"{key}[{name!r}] has {len(arrays[name])} entries, but the pool holds {expected} "
                                 f"{'samples' if name == 'lengths' else 'groups'}")
        if (len(samples) and int(samples.min()) < 1) or int(samples.sum()) != n:
            raise ValueError(f"{key}['samples'] must be positive group sizes adding up to the {n} indices, got "
                             f"{samples.tolist()[:8]}{'...' if len(samples) > 8 else ''}")
        if len(arrays["born"]) and (int(arrays["born"].min()) < 0 or (np.diff(arrays["born"]) < 0).any()):
            raise ValueError(f"{key}['born'] must be steps >= 0 in arrival order (non-decreasing)")
        try:  # the checks of an add: lengths, unique indices, the caps; and the columns derived again
            checked = self.prepare(arrays["indices"], arrays["lengths"], np.repeat(np.arange(len(samples)), samples),
                                   pending=False)
        except ValueError as error:
            raise ValueError(f"{key} breaks a promise of the planner: {error}".replace(
                "; nothing of this add was added", "").replace(" in this add", "")) from None
        for name, column in checked.columns.items():
            if not np.array_equal(column, arrays[name]):
                raise ValueError(
                    f"{key}[{name!r}] does not match the pending samples' lengths under this planner's "
                    f"max_token_len={self.max_token_len} and {self.cost_model!r}: the state was saved by a planner "
                    f"with other settings"
                )
        self._chunks = []
        self.indices, self.lengths = arrays["indices"], arrays["lengths"]
        self.columns = {name: arrays[name] for name in GROUP_COLUMNS}
        self._ids = set(self.indices.tolist())
        self._groups = len(self.columns["samples"])
