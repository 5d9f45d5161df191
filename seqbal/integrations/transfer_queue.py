"""TransferQueue 0.1.11 with a hard token cap: a sampler that replaces ``SeqlenBalancedSampler``.

TransferQueue's controller asks its sampler, once per data-parallel rank, for the samples of
training batch ``batch_index``; ``SeqlenBalancedSampler`` picks the oldest complete GRPO groups
(``n_samples_per_prompt`` consecutive indexes) for the global batch and spreads them over the
ranks with Karmarkar-Karp on their ``total_lengths``, with no cap on anything.
:class:`SeqbalSampler` takes the same arguments and answers the same calls, built on
:class:`seqbal.StepPlanner` (``samples_per_step = batch_size x dp_size``): the same oldest
complete groups, whole, planned into every rank's micro-batches under ``max_token_len`` (the
same count on every rank, slot-balanced). A rank's answer is its micro-batches concatenated,
in order; :meth:`SeqbalSampler.micro_batches` gives their boundaries.

Why a planner that persists between calls: the groups that became ready but did not fit a batch
wait in the planner's pool, in arrival (index) order, so the state of the sampler is the
planner's state plus the answers already given; ``save_checkpoint`` / ``load_checkpoint`` carry
both, and a restored sampler answers every later call as the saved one would have.

The first call for a ``(partition_id, task_name, batch_index)`` plans the batch and caches every
rank's answer, so every ``dp_rank`` gets its share of the same plan (and a repeated call the same
answer), as ``SeqlenBalancedSampler`` does. Lengths come from the partition's ``custom_meta``
(``{"total_lengths": n}``, as TransferQueue's own sampler reads them); with ``max_token_len``
a sample without one is a ``ValueError`` (a cap cannot be held on unknown lengths); without it
a missing length counts 1, as TransferQueue does.

TransferQueue is imported only when ``SeqbalSampler`` is first looked up (its ``BaseSampler``
is the class the controller accepts); :class:`StepSampler` is the same sampler without that base.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from ..stream import StepPlanner
from ..validation import int_argument, int_array

__all__ = ["StepSampler", "SeqbalSampler", "sampler_class", "TESTED"]

#: The TransferQueue version the sampler is tested with.
TESTED = "TransferQueue 0.1.11"
#: The cap used when ``max_token_len`` is None: no cap (one micro-batch per rank).
UNCAPPED = 1 << 40


def _complete_groups(indexes: list[int], size: int) -> list[list[int]]:
    """TransferQueue's ``GRPOGroupNSampler`` rule: in ascending order, every run of ``size``
    consecutive indexes is a group (a run that is not consecutive moves on by one). O(n)."""
    groups, i = [], 0
    while i <= len(indexes) - size:
        window = indexes[i:i + size]
        if window[-1] - window[0] == size - 1:
            groups.append(window)
            i += size
        else:
            i += 1
    return groups


class StepSampler:
    """A TransferQueue sampler on :class:`seqbal.StepPlanner` (see the module docstring).

    Args:
        n_samples_per_prompt: GRPO group size; a group is never split (not across ranks, not
            across micro-batches). Default 1.
        dp_size: data-parallel ranks that each ask for their share. Default 1.
        max_token_len: hard cap on every micro-batch's cost, or None (no cap: one micro-batch
            per rank, balanced like ``SeqlenBalancedSampler``).
        cost_model: what the cap bounds (tokens by default, ``"padded"``, a ``CostModel``).
        max_samples_per_micro_batch: a cap on samples per micro-batch. Default None.
        workload_fn: what the ranks' micro-batches balance (lengths -> non-negative workloads,
            see :func:`seqbal.plan_micro_batches`). Default None: :func:`seqbal.calculate_workload`.
        micro_batch_order: the order of every rank's micro-batches: ``"pipeline"`` (default) or
            ``"largest_first"`` (:class:`seqbal.StepPlanner`).

    ``sample(ready_indexes, batch_size, task_name, partition_id, dp_rank=, batch_index=,
    partition=)`` returns ``(sampled, consumed)`` (identical): this rank's samples, its
    micro-batches one after another. ``batch_size`` is per rank, as in TransferQueue; a batch is
    taken when ``batch_size x dp_size`` samples of complete groups are ready, else ``([], [])``.
    """

    def __init__(self, n_samples_per_prompt: int = 1, dp_size: int = 1, *, max_token_len: Optional[int] = None,
                 cost_model: Any = None, max_samples_per_micro_batch: Optional[int] = None,
                 workload_fn: Optional[Any] = None, micro_batch_order: str = "pipeline") -> None:
        n_samples_per_prompt = int_argument("n_samples_per_prompt", n_samples_per_prompt, expected="positive (an int >= 1)")
        dp_size = int_argument("dp_size", dp_size, expected="positive (an int >= 1)")
        self.n_samples_per_prompt = n_samples_per_prompt
        self.dp_size = dp_size
        self.max_token_len = max_token_len
        self.cost_model = cost_model
        self.max_samples_per_micro_batch = max_samples_per_micro_batch
        self.workload_fn = workload_fn
        self.micro_batch_order = micro_batch_order
        self._states: dict[Any, Any] = {}
        #: (partition_id, task_name, batch_index) -> [rank][micro_batch] -> indexes
        self._plans: dict[tuple, list[list[list[int]]]] = {}
        #: (partition_id, task_name) -> the planner of that stream
        self._planners: dict[tuple, StepPlanner] = {}
        self._planner(None, 1)  # the arguments are checked now, not at the first batch

    # -- TransferQueue's interface -------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
        return self.sample(*args, **kwargs)

    def sample(self, ready_indexes: list[int], batch_size: int, task_name: str = "", partition_id: str = "",
               *args: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
        """This rank's share of batch ``batch_index`` (see the class docstring).

        ``dp_rank`` is an int (Python or NumPy) in ``[0, dp_size)``. A rank outside it is a
        ``ValueError`` before a batch is planned, so nothing leaves the pool for a share no rank
        would take; asked of a batch already answered, it gets ``([], [])``, as TransferQueue's
        own sampler answers it.

        Raises:
            ValueError: ``batch_size`` not a multiple of ``n_samples_per_prompt``; a ``dp_rank``
                that is not an int, or out of range for a batch not yet planned; with
                ``max_token_len``, a sample without ``total_lengths`` or a group over the cap
                (naming it). Nothing is consumed: the pending groups are unchanged.
        """
        dp_rank = int_argument("dp_rank", kwargs.get("dp_rank", 0), minimum=0, expected="an int >= 0")
        batch_index = kwargs.get("batch_index", 0)
        key = (partition_id, task_name, batch_index)
        if key not in self._plans:
            if dp_rank >= self.dp_size:
                raise ValueError(
                    f"dp_rank={dp_rank} is out of range for dp_size={self.dp_size}: the batch was not planned and "
                    f"nothing left the pool; ask with a dp_rank in [0, {self.dp_size})"
                )
            if batch_size % self.n_samples_per_prompt != 0:
                raise ValueError(
                    f"batch_size ({batch_size}) must be a multiple of n_samples_per_prompt ({self.n_samples_per_prompt})"
                )
            plan = self._plan(ready_indexes, batch_size * self.dp_size, partition_id, task_name, kwargs.get("partition"))
            if plan is None:
                return [], []
            self._plans[key] = plan
            states = self._states.setdefault(partition_id, {}).setdefault(task_name, {})
            for rank in range(self.dp_size):
                share = [i for mb in plan[rank] for i in mb]
                states.setdefault(rank, {})[batch_index] = (share, share.copy())
        plan = self._plans[key]
        if dp_rank >= len(plan):
            return [], []
        share = [i for mb in plan[dp_rank] for i in mb]
        return share, share.copy()

    @property
    def _balanced_cache(self) -> dict[tuple, list[list[int]]]:
        """Every answered batch's shares, by ``(partition_id, task_name, batch_index)``: the
        attribute ``SeqlenBalancedSampler`` keeps them in."""
        return {key: [[i for mb in rank for i in mb] for rank in plan] for key, plan in self._plans.items()}

    def micro_batches(self, partition_id: str, task_name: str, batch_index: int, dp_rank: int) -> list[list[int]]:
        """The micro-batches of ``dp_rank``'s share of an answered batch: lists of indexes,
        each within the cap, the same count on every rank (an empty list is a dummy: that rank
        has nothing for this slot). ``KeyError`` for a batch not answered yet."""
        return [list(mb) for mb in self._plans[(partition_id, task_name, batch_index)][dp_rank]]

    def has_cached_result(self, partition_id: str, task_name: str, sampling_config: Optional[dict] = None) -> bool:
        """TransferQueue's polling check: whether ``sampling_config``'s batch was answered."""
        sampling_config = sampling_config or {}
        dp_rank = sampling_config.get("dp_rank")
        if dp_rank is None:
            return False
        states = self._states.get(partition_id, {}).get(task_name, {})
        return dp_rank in states and sampling_config.get("batch_index") in states[dp_rank]

    def clear_cache(self, partition_id: str) -> None:
        """Forget a partition: its answers and its pending groups."""
        self._states.pop(partition_id, None)
        self._plans = {k: v for k, v in self._plans.items() if k[0] != partition_id}
        self._planners = {k: v for k, v in self._planners.items() if k[0] != partition_id}

    def save_checkpoint(self) -> dict:
        """Everything the sampler knows: answers given and every stream's planner state."""
        return {
            "_states": copy.deepcopy(self._states),
            "plans": copy.deepcopy(self._plans),
            "planners": {key: (p.samples_per_step, p.state_dict()) for key, p in self._planners.items()},
        }

    def load_checkpoint(self, state: dict) -> None:
        """Restore :meth:`save_checkpoint`'s output; later calls answer as the saved sampler would."""
        self._states = copy.deepcopy(state["_states"])
        self._plans = copy.deepcopy(state["plans"])
        self._planners = {}
        for key, (samples, planner_state) in state["planners"].items():
            planner = self._planner(None, samples)
            planner.load_state_dict(planner_state)
            self._planners[key] = planner

    # -- planning ------------------------------------------------------------------------------

    def _planner(self, key: Optional[tuple], samples: int) -> StepPlanner:
        """The planner of stream ``key`` with ``samples`` per step (a new one, keeping the
        pending groups, when the batch size changes)."""
        planner = self._planners.get(key) if key is not None else None
        if planner is not None and planner.samples_per_step == samples:
            return planner
        fresh = StepPlanner(
            UNCAPPED if self.max_token_len is None else self.max_token_len, self.dp_size, samples_per_step=samples,
            cost_model=self.cost_model, max_samples_per_micro_batch=self.max_samples_per_micro_batch,
            workload_fn=self.workload_fn, micro_batch_order=self.micro_batch_order,
        )
        if planner is not None:
            fresh.load_state_dict(planner.state_dict())
        if key is not None:
            self._planners[key] = fresh
        return fresh

    def _plan(self, ready: list[int], samples: int, partition_id: str, task_name: str,
              partition: Any) -> Optional[list[list[list[int]]]]:
        ready_values = int_array(ready, "ready_indexes", integral_floats=False, negative=True, sums=False).tolist()
        planner = self._planner((partition_id, task_name), samples)
        pending = set(planner._pool.indices.tolist()) if planner.pending else set()
        fresh = [i for i in sorted(ready_values) if i not in pending]
        groups = _complete_groups(fresh, self.n_samples_per_prompt)
        if groups:
            indexes = [i for group in groups for i in group]
            meta = partition.get_custom_meta(indexes) if partition is not None else {}
            lengths = []
            for i in indexes:
                length = (meta.get(i) or {}).get("total_lengths")
                if length is None:
                    if self.max_token_len is not None:
                        raise ValueError(
                            f"sample {i} has no total_lengths in its custom_meta: a cap of max_token_len="
                            f"{self.max_token_len} cannot be held on unknown lengths; put "
                            f"custom_meta={{'total_lengths': n}} with every sample"
                        )
                    length = 1
                lengths.append(int(length))
            planner.add(indexes, lengths, groups=[g[0] for g in groups for _ in g])
        return planner.next_step()


def sampler_class() -> type:
    """``SeqbalSampler``: :class:`StepSampler` that is also TransferQueue's ``BaseSampler``
    (what its controller accepts). Imports TransferQueue."""
    global _CLASS
    if _CLASS is None:
        from transfer_queue.sampler import BaseSampler

        _CLASS = type("SeqbalSampler", (StepSampler, BaseSampler), {"__doc__": StepSampler.__doc__, "__module__": __name__})
    return _CLASS


_CLASS: Optional[type] = None


def __getattr__(name: str) -> Any:
    if name == "SeqbalSampler":
        return sampler_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
