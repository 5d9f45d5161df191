"""Cost models: what a micro-batch costs against ``max_token_len``, and the padded partitioner.

``max_token_len`` bounds memory only if it caps what the forward pass really holds. A
remove-padding forward (varlen attention on packed tokens) holds the effective tokens; a padded
forward holds ``samples x longest``; sequence parallelism and FP8 kernels pad each sequence, or
the packed micro-batch, up to a multiple. :class:`CostModel` names which of these the cap
bounds, and every planning entry point takes one.

Two of the models reduce to the default one, so they reuse the token partitioner unchanged:
rounding each sequence up to a multiple ``m`` is the token model on rounded lengths, and
rounding the packed micro-batch up to a multiple ``b`` is the token model under the cap
``b * floor(cap / b)`` (``roundup(s, b) <= cap`` exactly when ``s <= b * floor(cap / b)``).

The padded model needs its own partitioner, and has a simpler one: sorted by (rounded)
longest sample, some optimal partition is made of contiguous runs (swapping a long sample of a
short-headed run with a shorter one of a long-headed run never raises either run's longest),
and whether a run fits (``samples x its first length <= cap``) only gets easier as the run
shrinks. Greedily taking the longest run that fits from the top therefore gives the fewest
micro-batches exactly, in O(n log n). Balance is then a bottleneck search over the same runs:
the smallest padded workload ``T`` such that runs of workload ``<= T`` that fit the cap number
at most ``k``, found by bisection with an O(k) greedy per probe; runs are then split, heaviest
first, up to exactly ``k``. Splitting a run never raises its cost, so a count that is feasible
stays feasible at every larger count up to the number of groups: the same monotonicity the
data-parallel agreement relies on for the token model.

A memory cost (:class:`MemoryCost`, fitted by :func:`seqbal.memory.calibrate`) is the token
model again, on other per-sample numbers: a sample costs the bytes it adds to the step's peak,
``ceil(per_sequence + per_token * s + per_token_squared * s**2)``, and a micro-batch costs a
fixed overhead plus the sum over its samples. The sum is what the token partitioner packs, under
the capacity ``cap - fixed``; the balance still weighs the (rounded) lengths.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np

from .validation import int_argument
from .workload import balance_workloads

__all__ = [
    "CostModel",
    "MemoryCost",
    "as_cost_model",
    "padded_min_count",
    "padded_partitions",
]


@dataclass(frozen=True)
class MemoryCost:
    """Predicted peak bytes of a micro-batch: ``fixed + sum over its samples of
    ceil(per_sequence + per_token * s + per_token_squared * s**2)``.

    Additive over samples, so every token planner packs it exactly; the terms of a fitted model
    that are not additive (the longest sequence's) are folded in by
    :meth:`seqbal.memory.Calibration.cost_model`, which can only raise the prediction.

    Args:
        fixed: bytes of any micro-batch, even an empty one (int, >= 0).
        per_sequence: bytes per sample (>= 0).
        per_token: bytes per token (>= 0).
        per_token_squared: bytes per squared token of a sample (>= 0): attention scores held
            for the backward (eager or math attention).

    Examples:
        >>> MemoryCost(fixed=100, per_token=2.0, per_token_squared=0.5).sample_bytes(np.array([4, 1])).tolist()
        [16, 3]
    """

    fixed: int = 0
    per_sequence: float = 0.0
    per_token: float = 0.0
    per_token_squared: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "fixed", int_argument("fixed", self.fixed, expected="an int >= 0", minimum=0))
        for name in ("per_sequence", "per_token", "per_token_squared"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
                np.isfinite(value) and value >= 0
            ):
                raise ValueError(f"MemoryCost.{name} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))

    def sample_bytes(self, lengths: np.ndarray) -> np.ndarray:
        """Bytes each sample adds (int64, rounded up), one float64 expression for every caller,
        so that the same lengths cost the same on every rank and machine. O(n).

        Raises:
            ValueError: a cost that does not fit int64.
        """
        s = np.asarray(lengths, dtype=np.float64)
        value = np.ceil(self.per_sequence + s * self.per_token + s * s * self.per_token_squared)
        if value.size and not value.max() < 2.0 ** 62:
            raise ValueError(f"a sample of {int(s[np.argmax(value)])} tokens costs {value.max():.3g} bytes under "
                             f"{self!r}: more than int64 can count")
        return value.astype(np.int64)

    def match_values(self) -> tuple[int, ...]:
        """The coefficients as non-negative ints (float64 bit patterns), for the ranks' agreement."""
        return (self.fixed, *(int(np.float64(getattr(self, name)).view(np.int64))
                              for name in ("per_sequence", "per_token", "per_token_squared")))


@dataclass(frozen=True)
class CostModel:
    """What a micro-batch costs against ``max_token_len``.

    Args:
        padded: False (default): a micro-batch costs its tokens (remove-padding forwards).
            True: it costs ``samples x longest`` (padded forwards: Hugging Face models by
            default, verl with ``use_remove_padding=False``, TRL).
        round_to: every sequence length is first rounded up to a multiple of this (sequence or
            context parallelism, FP8 kernels, NeMo-RL's ``sequence_length_round``). Default 1.
        pack_round_to: token model only: the packed micro-batch's tokens are rounded up to a
            multiple of this (Ulysses pads the packed micro-batch to a multiple of ``sp_size``).
            Default 1.
        memory: token model only: a micro-batch costs its predicted peak bytes
            (:class:`MemoryCost`, of the rounded lengths), and ``max_token_len`` is then a
            budget in bytes. Built by :func:`seqbal.memory.calibrate`. Default None (tokens).

    Examples:
        >>> CostModel().cost([5, 3])
        8
        >>> CostModel(padded=True).cost([5, 3])
        10
        >>> CostModel(round_to=4, pack_round_to=16).cost([5, 3])
        16
        >>> str(CostModel(padded=True, round_to=8))
        'padded cost (samples x longest, each length rounded up to a multiple of 8)'
    """

    padded: bool = False
    round_to: int = 1
    pack_round_to: int = 1
    memory: Optional[MemoryCost] = None

    def __post_init__(self) -> None:
        if not isinstance(self.padded, (bool, np.bool_)):
            raise ValueError(f"padded must be True or False, got {self.padded!r}")
        object.__setattr__(self, "padded", bool(self.padded))
        for name in ("round_to", "pack_round_to"):  # any size, as before: only the type and the minimum are checked here
            object.__setattr__(self, name, int_argument(name, getattr(self, name), expected="an int >= 1", maximum=None))
        if self.padded and self.pack_round_to != 1:
            raise ValueError(
                f"pack_round_to={self.pack_round_to} applies to the token cost only: a padded micro-batch "
                f"is rounded per sequence (round_to)"
            )
        if self.memory is not None:
            if not isinstance(self.memory, MemoryCost):
                raise ValueError(f"memory must be None or a seqbal.cost.MemoryCost, got {self.memory!r}")
            if self.padded or self.pack_round_to != 1:
                raise ValueError(
                    f"memory applies to the token cost without packed rounding, got padded={self.padded}, "
                    f"pack_round_to={self.pack_round_to}"
                )

    @property
    def is_default(self) -> bool:
        """True for plain effective tokens, the model of every call that names none."""
        return self == CostModel()

    def __repr__(self) -> str:
        """``CostModel(...)`` with only the fields that differ from the default: short, and
        ``eval(repr(model)) == model`` (with ``CostModel`` imported).

        >>> CostModel(), CostModel(padded=True, round_to=8)
        (CostModel(), CostModel(padded=True, round_to=8))
        """
        fields = [f"{name}={getattr(self, name)!r}" for name, default in (("padded", False), ("round_to", 1),
                  ("pack_round_to", 1), ("memory", None)) if getattr(self, name) != default]
        return f"CostModel({', '.join(fields)})"

    def __str__(self) -> str:
        rounding = f", each length rounded up to a multiple of {self.round_to}" if self.round_to > 1 else ""
        if self.padded:
            return f"padded cost (samples x longest{rounding})"
        if self.memory is not None:
            m = self.memory
            return (f"memory cost (predicted bytes: {m.fixed} + per sample {m.per_sequence:.6g} + "
                    f"{m.per_token:.6g} x tokens + {m.per_token_squared:.6g} x tokens^2{rounding})")
        packing = f", the micro-batch rounded up to a multiple of {self.pack_round_to}" if self.pack_round_to > 1 else ""
        return f"token cost (effective tokens{rounding}{packing})"

    def rounded(self, lengths: np.ndarray) -> np.ndarray:
        """Lengths rounded up to a multiple of ``round_to`` (int64; unchanged when it is 1). O(n)."""
        if self.round_to == 1:
            return lengths
        return -(-lengths // self.round_to) * self.round_to

    def sample_costs(self, lengths: np.ndarray) -> np.ndarray:
        """What each sample adds to a micro-batch's cost under the token model (int64): its
        rounded length, or under ``memory`` its bytes. O(n).

        >>> CostModel(round_to=4).sample_costs(np.array([5, 3])).tolist()
        [8, 4]
        """
        rounded = self.rounded(np.asarray(lengths, dtype=np.int64))
        return rounded if self.memory is None else self.memory.sample_bytes(rounded)

    def token_capacity(self, max_token_len: int) -> int:
        """Token model: the largest packed token count whose rounded cost is ``<= max_token_len``
        (under ``memory``: the largest sum of sample bytes, the cap less the fixed bytes)."""
        if self.memory is not None:
            return max_token_len - self.memory.fixed
        return max_token_len // self.pack_round_to * self.pack_round_to

    def sample_capacity(self, max_token_len: int) -> int:
        """The largest (rounded) length a lone sample may have: its cost is then within the cap.

        >>> CostModel(pack_round_to=8).sample_capacity(20), CostModel(padded=True).sample_capacity(20)
        (16, 20)
        """
        return max_token_len if self.padded else self.token_capacity(max_token_len)

    def cost(self, lengths: Sequence[int]) -> int:
        """Cost of one micro-batch holding samples of these effective lengths. O(len)."""
        if self.memory is not None:
            values = [int(s) for s in lengths]
            return self.memory.fixed + int(self.sample_costs(np.array(values, dtype=np.int64)).sum()) if values else 0
        rounded = [-(-int(s) // self.round_to) * self.round_to for s in lengths]
        if not rounded:
            return 0
        if self.padded:
            return len(rounded) * max(rounded)
        return -(-sum(rounded) // self.pack_round_to) * self.pack_round_to

    def group_costs(self, lengths: np.ndarray, group_size: int) -> np.ndarray:
        """Cost of each run of ``group_size`` consecutive samples as one micro-batch (int64). O(n).

        >>> CostModel(padded=True).group_costs(np.array([5, 3, 2, 2]), 2).tolist()
        [10, 4]
        """
        if self.memory is not None:
            return self.memory.fixed + self.sample_costs(lengths).reshape(-1, group_size).sum(axis=1)
        rounded = self.rounded(np.asarray(lengths, dtype=np.int64)).reshape(-1, group_size)
        if self.padded:
            return group_size * rounded.max(axis=1)
        return -(-rounded.sum(axis=1) // self.pack_round_to) * self.pack_round_to

    def part_costs(self, lengths: Sequence[int], parts: Sequence[Sequence[int]]) -> list[int]:
        """Cost of every micro-batch, ``parts`` being index lists into ``lengths``. O(n)."""
        values = [int(s) for s in lengths]
        return [self.cost([values[i] for i in part]) for part in parts]


#: Names accepted wherever a cost model is: ``cost_model="tokens"`` or ``"padded"``.
_NAMED = {"tokens": CostModel(), "padded": CostModel(padded=True)}


def as_cost_model(value: Union[None, str, CostModel]) -> CostModel:
    """The :class:`CostModel` for ``None`` (tokens), ``"tokens"``, ``"padded"`` or a CostModel.

    Raises:
        ValueError: anything else, naming what was passed.

    >>> as_cost_model("padded").padded, as_cost_model(None).is_default
    (True, True)
    """
    if value is None:
        return _NAMED["tokens"]
    if isinstance(value, CostModel):
        return value
    if isinstance(value, str) and value in _NAMED:
        return _NAMED[value]
    raise ValueError(f"cost_model must be 'tokens', 'padded' or a seqbal.CostModel, got {value!r}")


# ---------------------------------------------------------------------------------------------
# The padded partitioner: contiguous runs of groups sorted by their longest sample
# ---------------------------------------------------------------------------------------------


def _sorted_heads(group_longest: np.ndarray) -> np.ndarray:
    """Group order by longest sample descending, index ascending on ties (deterministic)."""
    return np.lexsort((np.arange(len(group_longest)), -group_longest))


class _Runs:
    """Groups in length-sorted order, with what a run ``[a, b)`` of them holds and costs.

    A run's padded cost is its samples times its first (longest) length; its padded workload is
    its samples times the workload of that length.
    """

    def __init__(
        self,
        group_longest: Sequence[int],
        group_sizes: Union[int, Sequence[int]],
        capacity: int,
        workload_fn: Optional[Callable[[np.ndarray], np.ndarray]] = None,
    ) -> None:
        longest = np.asarray(group_longest, dtype=np.int64)
        self.total = len(longest)
        self.order = _sorted_heads(longest)
        sizes = np.broadcast_to(np.asarray(group_sizes, dtype=np.int64), longest.shape)[self.order]
        heads = longest[self.order]
        self.heads = heads.tolist()
        self.sizes = sizes.tolist()
        prefix = np.concatenate(([0], np.cumsum(sizes)))
        self.prefix = prefix.tolist()
        # The longest run from each position that fits the cap: samples <= capacity // head
        # (a run of empty samples costs nothing, so it may take every group left).
        room = np.where(heads > 0, capacity // np.maximum(heads, 1), prefix[-1])
        ends = np.searchsorted(prefix, prefix[:-1] + room, side="right") - 1
        self.fit_end = np.minimum(ends, self.total).tolist()
        self.head_work = [int(w) for w in workload_fn(heads)] if workload_fn is not None else None

    def fits_alone(self) -> bool:
        return all(end > start for start, end in enumerate(self.fit_end))

    def work(self, start: int, stop: int) -> int:
        assert self.head_work is not None
        return (self.prefix[stop] - self.prefix[start]) * self.head_work[start]

    def greedy(self, limit: Optional[int] = None) -> list[tuple[int, int]]:
        """Maximal runs ``(start, stop)`` that fit the cap and, if given, have workload <= limit."""
        runs, position = [], 0
        while position < self.total:
            stop = self.fit_end[position]
            per_sample = self.head_work[position] if limit is not None else 0
            if per_sample:
                samples = limit // per_sample
                stop = min(stop, max(position + 1, bisect.bisect_right(self.prefix, self.prefix[position] + samples) - 1))
            runs.append((position, stop))
            position = stop
        return runs


def padded_min_count(group_longest: Sequence[int], group_size: Union[int, Sequence[int]], capacity: int) -> int:
    """Fewest micro-batches of padded cost ``<= capacity``: exact when groups have equal sizes.

    ``group_longest[i]`` is the longest (rounded) sample of group ``i`` and ``group_size`` its
    number of samples (one int for all groups, or one per group); a micro-batch costs its
    samples times its longest. Greedy over the runs of the length-sorted order, optimal for
    equal group sizes by the argument in the module docstring (with unequal sizes, a feasible
    count, not always the least). O(n log n).

    Raises:
        ValueError: a group that does not fit on its own.

    >>> padded_min_count([10, 2, 2, 2, 9, 3], 1, 20)  # [10, 9] [3, 2, 2, 2]
    2
    """
    runs = _Runs(group_longest, group_size, capacity)
    for position, end in enumerate(runs.fit_end):
        if end <= position:
            size, head = runs.sizes[position], runs.heads[position]
            raise ValueError(
                f"a group of {size} sample(s) padded to {head} tokens costs {size * head} > capacity {capacity}"
            )
    return len(runs.greedy())


def padded_partitions(
    group_longest: Sequence[int],
    group_size: Union[int, Sequence[int]],
    capacity: int,
    k: int,
    *,
    workload_fn: Callable[[np.ndarray], np.ndarray] = balance_workloads,
) -> Optional[list[list[int]]]:
    """``k`` micro-batches of groups, each of padded cost ``<= capacity``, balanced on padded work.

    A micro-batch's padded workload is ``samples * workload_fn(longest)`` (attention and linear
    layers run on the padded shape; ``workload_fn`` maps an int64 array of lengths to their
    workloads; by default :func:`seqbal.workload.balance_workloads`, the default model exact
    wherever its total fits int64 and in float64 beyond, as under the token cost). The micro-batches are runs of
    the length-sorted order: the largest run workload is minimised by bisection (each probe a
    greedy of O(k log n)), then runs are split, heaviest first, until there are exactly ``k``.
    Returns ``None`` when ``k`` is below the greedy count (:func:`padded_min_count`) or above the
    number of groups. Deterministic.

    Complexity: O(n log n + k log n log W) with W the largest run workload.

    Returns:
        ``k`` lists of group indices, each ascending, heaviest run first.

    >>> padded_partitions([10, 2, 2, 2, 9, 3], 1, 20, 2)
    [[0, 4], [1, 2, 3, 5]]
    >>> padded_partitions([10, 2, 2, 2, 9, 3], 1, 20, 1) is None
    True
    """
    if k < 1 or k > len(group_longest):
        return None
    runs = _Runs(group_longest, group_size, capacity, workload_fn)
    if not runs.fits_alone() or len(runs.greedy()) > k:
        return None
    # The bottleneck lies between the heaviest single group and the heaviest cap-fitting run.
    low = max(size * work for size, work in zip(runs.sizes, runs.head_work))
    high = max(runs.work(a, b) for a, b in runs.greedy())
    while low < high:  # invariant: the runs under ``high`` number at most k
        middle = (low + high) // 2
        if len(runs.greedy(middle)) <= k:
            high = middle
        else:
            low = middle + 1
    chosen = runs.greedy(high)
    # Split the heaviest splittable run in halves until there are k (never raises a cost).
    heap = [(-runs.work(a, b), a, b) for a, b in chosen]
    heapq.heapify(heap)
    done: list[tuple[int, int]] = []
    while len(heap) + len(done) < k:
        _, a, b = heapq.heappop(heap)
        if b - a < 2:
            done.append((a, b))
            continue
        middle = (a + b + 1) // 2
        heapq.heappush(heap, (-runs.work(a, middle), a, middle))
        heapq.heappush(heap, (-runs.work(middle, b), middle, b))
    final = sorted(done + [(a, b) for _, a, b in heap], key=lambda run: (-runs.work(*run), run[0]))
    order = runs.order.tolist()
    return [sorted(order[a:b]) for a, b in final]
