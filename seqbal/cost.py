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
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from .workload import calculate_workload

__all__ = [
    "CostModel",
    "as_cost_model",
    "padded_min_count",
    "padded_partitions",
]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


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

    def __post_init__(self) -> None:
        if not isinstance(self.padded, (bool, np.bool_)):
            raise ValueError(f"padded must be True or False, got {self.padded!r}")
        object.__setattr__(self, "padded", bool(self.padded))
        object.__setattr__(self, "round_to", _positive_int("round_to", self.round_to))
        object.__setattr__(self, "pack_round_to", _positive_int("pack_round_to", self.pack_round_to))
        if self.padded and self.pack_round_to != 1:
            raise ValueError(
                f"pack_round_to={self.pack_round_to} applies to the token cost only: a padded micro-batch "
                f"is rounded per sequence (round_to)"
            )

    @property
    def is_default(self) -> bool:
        """True for plain effective tokens, the model of every call that names none."""
        return self == CostModel()

    def __str__(self) -> str:
        rounding = f", each length rounded up to a multiple of {self.round_to}" if self.round_to > 1 else ""
        if self.padded:
            return f"padded cost (samples x longest{rounding})"
        packing = f", the micro-batch rounded up to a multiple of {self.pack_round_to}" if self.pack_round_to > 1 else ""
        return f"token cost (effective tokens{rounding}{packing})"

    def rounded(self, lengths: np.ndarray) -> np.ndarray:
        """Lengths rounded up to a multiple of ``round_to`` (int64; unchanged when it is 1). O(n)."""
        if self.round_to == 1:
            return lengths
        return -(-lengths // self.round_to) * self.round_to

    def token_capacity(self, max_token_len: int) -> int:
        """Token model: the largest packed token count whose rounded cost is ``<= max_token_len``."""
        return max_token_len // self.pack_round_to * self.pack_round_to

    def cost(self, lengths: Sequence[int]) -> int:
        """Cost of one micro-batch holding samples of these effective lengths. O(len)."""
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


def _fit_counts(head_lengths: np.ndarray, group_size: int, capacity: int) -> np.ndarray:
    """How many groups a run headed by each sorted position may hold under the cap (a run of
    empty samples costs nothing, so it may hold them all)."""
    unlimited = len(head_lengths)
    return np.where(head_lengths > 0, capacity // (group_size * np.maximum(head_lengths, 1)), unlimited)


def padded_min_count(group_longest: Sequence[int], group_size: int, capacity: int) -> int:
    """Fewest micro-batches of padded cost ``<= capacity`` (exact, not a bound).

    ``group_longest[i]`` is the longest (rounded) sample of forced group ``i``; a micro-batch of
    ``t`` groups costs ``t * group_size * (its longest)``. Every group must fit on its own.
    Greedy over the runs of the length-sorted order, optimal by the argument in the module
    docstring. O(n log n) for the sort, O(count) after.

    >>> padded_min_count([10, 2, 2, 2, 9, 3], 1, 20)  # [10, 9] [3, 2, 2, 2]
    2
    """
    longest = np.asarray(group_longest, dtype=np.int64)
    heads = longest[_sorted_heads(longest)]
    fits = _fit_counts(heads, group_size, capacity).tolist()
    count, position = 0, 0
    while position < len(heads):
        if fits[position] < 1:
            raise ValueError(
                f"a group of {group_size} sample(s) padded to {int(heads[position])} tokens costs "
                f"{group_size * int(heads[position])} > capacity {capacity}"
            )
        position += fits[position]
        count += 1
    return count


def _runs_under(
    fits: list[int], run_work: Callable[[int, int], int], limit: Optional[int], total: int
) -> list[tuple[int, int]]:
    """Greedy maximal runs ``(start, stop)`` that fit the cap and, if given, workload ``<= limit``."""
    runs, position = [], 0
    while position < total:
        stop = min(total, position + fits[position])
        if limit is not None:
            per_group = run_work(position, position + 1)
            stop = min(stop, position + max(1, limit // per_group if per_group else total))
        runs.append((position, stop))
        position = stop
    return runs


def padded_partitions(
    group_longest: Sequence[int],
    group_size: int,
    capacity: int,
    k: int,
    *,
    workload_fn: Callable[[np.ndarray], np.ndarray] = calculate_workload,
) -> Optional[list[list[int]]]:
    """``k`` micro-batches of groups, each of padded cost ``<= capacity``, balanced on padded work.

    A micro-batch's padded workload is ``samples * workload_fn(longest)`` (attention and linear
    layers run on the padded shape; ``workload_fn`` maps an int64 array of lengths to their
    workloads, :func:`~seqbal.calculate_workload` by default). Runs of the length-sorted order; the largest run
    workload is minimised by bisection (each probe a greedy of O(k)), then runs are split,
    heaviest first, until there are exactly ``k``. Returns ``None`` when ``k`` is below
    :func:`padded_min_count` or above the number of groups. Deterministic.

    Complexity: O(n log n + k log W) with W the largest run workload.

    Returns:
        ``k`` lists of group indices, each ascending, heaviest run first.

    >>> padded_partitions([10, 2, 2, 2, 9, 3], 1, 20, 2)
    [[0, 4], [1, 2, 3, 5]]
    >>> padded_partitions([10, 2, 2, 2, 9, 3], 1, 20, 1) is None
    True
    """
    longest = np.asarray(group_longest, dtype=np.int64)
    total = len(longest)
    if k < 1 or k > total:
        return None
    order = _sorted_heads(longest)
    heads = longest[order].tolist()
    fits = _fit_counts(longest[order], group_size, capacity).tolist()
    if min(fits) < 1 or len(_runs_under(fits, lambda a, b: 0, None, total)) > k:
        return None
    head_work = [int(w) for w in workload_fn(longest[order])]

    def run_work(start: int, stop: int) -> int:
        return (stop - start) * group_size * head_work[start]

    # The bottleneck lies between the heaviest single group and the heaviest cap-fitting run.
    low = group_size * max(head_work)
    high = max(run_work(a, b) for a, b in _runs_under(fits, run_work, None, total))
    while low < high:  # invariant: the runs under ``high`` number at most k
        middle = (low + high) // 2
        if len(_runs_under(fits, run_work, middle, total)) <= k:
            high = middle
        else:
            low = middle + 1
    runs = _runs_under(fits, run_work, high, total)
    # Split the heaviest splittable run in halves until there are k (never raises a cost).
    heap = [(-run_work(a, b), a, b) for a, b in runs]
    heapq.heapify(heap)
    done: list[tuple[int, int]] = []
    while len(heap) + len(done) < k:
        _, a, b = heapq.heappop(heap)
        if b - a < 2:
            done.append((a, b))
            continue
        middle = (a + b + 1) // 2
        heapq.heappush(heap, (-run_work(a, middle), a, middle))
        heapq.heappush(heap, (-run_work(middle, b), middle, b))
    runs = sorted(done + [(a, b) for _, a, b in heap], key=lambda run: (-run_work(*run), run[0]))
    order_list = order.tolist()
    return [sorted(order_list[a:b]) for a, b in runs]
