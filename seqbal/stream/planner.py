""":class:`StepPlanner`: which pending samples go into the next training step, and how they form
every rank's micro-batches.

Asynchronous RL trainers (rollouts arrive while the trainer trains) and fixed-count trainers
decide *what goes into a step* from a pool that fills over time. Two kinds of steps:

* ``micro_batches_per_step=K``: every rank runs exactly ``K`` micro-batches, each under the
  cap, filled with as many pending tokens as fit, oldest first (:mod:`seqbal.stream.fill`);
* ``samples_per_step=S``: every step takes exactly ``S`` samples of whole groups, oldest first
  (:mod:`seqbal.stream.exact`), planned into the fewest micro-batches, the same count on every
  rank: the count :func:`seqbal.build_dp_schedule` would plan. It is first tried at the lower
  bound no plan can go below (one capped balanced partition, the usual case, at a few
  best-fit-decreasing passes of the pool), and only where that fails does the step run
  ``build_dp_schedule`` itself (its count search costs several passes more on small pools).

The planner's state is what was added and how many steps were taken; everything else is derived
from it deterministically, so every rank that makes the same adds computes the same steps with
no collective (the design of ``DistributedSampler``: one seed, everything derived). Where each
rank sees only its own arrivals, ``dp_group`` gathers them once per step (one
``all_gather_object``); every check after it runs on the same gathered data on every rank, so
an error raises on all ranks alike and none is left waiting.

A bounded wait is a promise about the future that arrivals could break, so it is checked where
it is made: with ``max_wait_steps`` an :meth:`StepPlanner.add` that would put more in the pool
than can be emitted in time is refused (a ``ValueError``, the pool unchanged), the back-pressure
a rollout producer needs. Everything accepted is emitted in time.
"""

from __future__ import annotations

import copy
from typing import Any, Hashable, Optional, Sequence, Union

import numpy as np

from ..cost import CostModel, as_cost_model
from ..partition import capped_balanced_partitions, packing_lower_bound, rebalance_within_capacity, roundup_divisible
from ..partition.packing import split_bins_to_count
from ..partition.sample_cap import sample_count_bound, within_sample_cap
from ..partition.parts import ceildiv
from ..schedule.slots import SLOT_CLOSE_ENOUGH
from ..order import check_micro_batch_order
from ..validation import flag_argument, int_argument, int_array
from ..workload import WorkloadFn, workload_digest
from .exact import exact_selection
from .deadlines import DeadlineWitness
from .fill import fill_bins, top_up_bins
from .layout import layout_bins
from .pool import Arrivals, Pool

__all__ = ["StepPlanner", "EVEN_SLOTS_MIN_SAMPLES", "SAMPLES_PER_TRADE", "MAX_MICRO_BATCHES_PER_STEP", "OLDEST_PATIENCE"]

#: With ``even_slots=None``, a ``micro_batches_per_step`` step evens its slots when the pool
#: holds at least this many samples per micro-batch of the step (``K x num_replicas``).
EVEN_SLOTS_MIN_SAMPLES = 128

#: With ``even_slots=None``, a ``samples_per_step`` step's slot evening makes at most one trade
#: attempt per this many pending samples: a trade costs about as much as a best-fit-decreasing
#: pass over this many samples, so the evening stays within a pass or so of the pool's.
SAMPLES_PER_TRADE = 128

#: The most micro-batches one step may have (``micro_batches_per_step x num_replicas``): a step
#: is a list per micro-batch, and a flush lays out all of them even for one pending sample, so a
#: count beyond any real run's (a thousand ranks of 64 micro-batches) is refused when the planner
#: is built rather than allocated at the first flush.
MAX_MICRO_BATCHES_PER_STEP = 1 << 16

#: Without ``max_wait_steps``, a ``micro_batches_per_step`` step takes the oldest pending group
#: once it has waited this many steps (else it takes whatever fills the step best).
OLDEST_PATIENCE = 8

#: ``[rank][micro_batch]`` -> ascending sample indices.
Step = list[list[list[int]]]


def _members(bins: list[list[int]]) -> list[int]:
    return [g for b in bins for g in b]


def _placed(bins: list[list[int]], cost: np.ndarray) -> int:
    return int(sum(int(cost[g]) for b in bins for g in b))


def steps_disagreement(facts: Sequence[Sequence[Any]], names: Sequence[str]) -> Optional[str]:
    """The error every rank of ``dp_group`` raises before a step, decided from the facts gathered
    from every rank (:meth:`StepPlanner._facts`, one list per rank, in rank order), or None when
    the ranks may take the step. Every rank holds the same gathered facts, so every rank reaches
    the same verdict and none returns a step its peers do not take. Pure (no collective).

    Checked in this order: a rank whose ``flush`` was not a bool (its fact is then the error's
    message); a fact some rank holds differently from rank 0 (a setting, the steps taken, the
    pending samples, ``flush``); a ``num_replicas`` other than the group's size. O(ranks x facts).

    >>> names = ["num_replicas", "flush"]
    >>> steps_disagreement([[2, True], [2, False]], names)[:58]
    'the ranks of dp_group disagree: rank 0 has flush=True, ran'
    >>> steps_disagreement([[2, False], [2, False]], names) is None
    True
    """
    from ..collectives import first_disagreement

    world = len(facts)
    where = list(names).index("flush")
    for rank, theirs in enumerate(facts):
        if not isinstance(theirs[where], (bool, np.bool_)):
            return (f"next_step: rank {rank} of dp_group passed an invalid flush ({theirs[where]}); no rank took "
                    f"a step (this step's arrivals were not added)")
    differ = first_disagreement(facts, names)
    if differ is not None:
        name, mine, rank, theirs = differ
        what = ("every rank must pass the same flush to next_step, or one rank would take a step alone"
                 if name == "flush" else "every rank must build the same StepPlanner and take every step")
        return (f"the ranks of dp_group disagree: rank 0 has {name}={mine!r}, rank {rank} has {theirs!r}; {what}; "
                f"no rank took a step (this step's arrivals were not added)")
    replicas = facts[0][list(names).index("num_replicas")]
    if replicas != world:
        return (f"num_replicas={replicas} on every rank, but dp_group has {world} ranks: a step is laid out over "
                f"num_replicas ranks, one share per rank of dp_group; pass num_replicas={world} (no rank took a step; "
                f"this step's arrivals were not added)")
    return None


class StepPlanner:
    """Plans each training step from a pool of pending samples that fills over time.

    Args:
        max_token_len: hard cap on every micro-batch's cost (effective tokens by default).
        num_replicas: data-parallel ranks every step is laid out over, >= 1.
        micro_batches_per_step: ``K``: every step has exactly ``K`` micro-batches on every
            rank, each non-empty (except a flush's dummies), filled with as many pending tokens
            as fit. A step needs at least ``K * num_replicas`` pending groups.
        samples_per_step: ``S``: every step takes exactly ``S`` samples (whole groups, oldest
            first) and plans them into the fewest micro-batches, the same count on every rank;
            ranks left without a group get empty micro-batches. Give exactly one of the two.
        cost_model: what the cap bounds: None or ``"tokens"`` (effective tokens),
            ``"padded"`` (samples x longest) or a :class:`seqbal.CostModel` with rounding.
        max_samples_per_micro_batch: a second hard cap, on samples per micro-batch. Default None.
        max_wait_steps: ``w``: a sample added before step ``t`` (``t`` steps already taken) is
            emitted by step ``t + w`` (``w = 0``: in the very next step). The planner keeps the
            promise by refusing arrivals beyond what it can emit in time: at most
            ``(w + 1) * K * num_replicas`` groups pending (a step can always take
            ``K * num_replicas`` groups, one per micro-batch; with ``K``, the planner keeps a
            schedule of every pending group to a step by its deadline, and a step takes the
            fullest fill that leaves such a schedule: :mod:`seqbal.stream.deadlines`), or
            ``(w + 1) * S`` samples with ``samples_per_step``,
            where every group must then have the same size, a divisor of ``S`` (the oldest
            ``S`` samples are then always a whole number of groups). Default None (no bound;
            steps still prefer the oldest).
        dp_group: a torch.distributed process group whose ranks each :meth:`add` only their
            own arrivals: :meth:`next_step` gathers them (one collective per step) before
            planning, so every rank plans the same steps. Indices must be unique across ranks.
            Default None: every rank makes the same adds itself (no collective at all).
        even_slots: even out every slot's micro-batches across ranks with the global
            schedule's group moves and swaps (:func:`seqbal.build_dp_schedule`, step 5), or
            (False) only sort them into slots and place them on ranks. The evening costs about
            a third of a millisecond per micro-batch of the step whatever the pool, so None
            (the default) keeps it within a few best-fit-decreasing passes over the pool: a
            ``micro_batches_per_step`` step runs it when the pool holds at least
            :data:`EVEN_SLOTS_MIN_SAMPLES` samples per micro-batch of the step; a
            ``samples_per_step`` step runs it with at most one trade attempt per
            :data:`SAMPLES_PER_TRADE` pending samples (True: to the end, as
            ``build_dp_schedule`` does). docs/streams.md has the figures.
        workload_fn: what the slots balance: lengths -> non-negative workloads (as in
            :func:`seqbal.plan_micro_batches`). Default None: :func:`seqbal.calculate_workload`.
            With ``dp_group``, every rank must pass the same model (compared by a digest of its
            workloads on fixed probe lengths, in the gather each step already makes).
        micro_batch_order: the order of a step's slots on every rank: ``"pipeline"`` (default:
            light slots at both ends) or ``"largest_first"`` (the slot with the largest
            micro-batch first, for the caching allocator; :mod:`seqbal.order`).
        oldest_first: with ``micro_batches_per_step``, every step takes the
            ``K * num_replicas`` oldest pending groups and fills the rest of its room in arrival
            order only, never with a fuller fill that takes younger groups first
            (:func:`seqbal.stream.fill_bins`'s ``oldest_only``): the pool drains in arrival
            order, at the cost of steps that can hold fewer tokens than the default's. For a
            caller that builds a new planner every step from a buffer (no history, so
            ``oldest_patience`` could never come due). It keeps any ``max_wait_steps`` too
            (the admission bound leaves at most ``w + 1`` steps' worth of groups ahead of any
            group). Default False; True with ``samples_per_step`` is a ``ValueError``.

    Attributes:
        steps: how many steps were taken (the ``t`` of ``max_wait_steps``).
        oldest_first: the constructor's argument (a bool; compared across the ranks of
            ``dp_group`` with the other settings).
        oldest_patience: without ``max_wait_steps`` or ``oldest_first``, a ``K`` step takes the
            oldest pending group once it has waited this many steps (default
            :data:`OLDEST_PATIENCE`); 0: every step takes the oldest group (and otherwise
            keeps the fullest fill).

    Examples:
        Two ranks, two micro-batches each, under a cap of 10 tokens (a pool this small would
        skip the slot evening by default):

        >>> planner = StepPlanner(10, 2, micro_batches_per_step=2, even_slots=True)
        >>> planner.add(range(6), [6, 5, 4, 3, 2, 9])
        >>> planner.next_step()  # slot 0 holds 10 and 9 tokens, slot 1 holds 5 and 5
        [[[0, 2], [3, 4]], [[5], [1]]]
        >>> planner.pending, planner.next_step(), planner.next_step(flush=True)
        (0, None, None)

        Whole groups of 2 samples, 4 samples a step:

        >>> planner = StepPlanner(8, 2, samples_per_step=4)
        >>> planner.add([10, 11, 12, 13, 14, 15], [3, 3, 4, 2, 5, 1], groups=[0, 0, 1, 1, 2, 2])
        >>> planner.next_step(), planner.pending
        ([[[10, 11]], [[12, 13]]], 2)
        >>> planner.next_step(flush=True)
        [[[14, 15]], [[]]]
    """

    def __init__(
        self,
        max_token_len: int,
        num_replicas: int,
        *,
        micro_batches_per_step: Optional[int] = None,
        samples_per_step: Optional[int] = None,
        cost_model: Union[None, str, CostModel] = None,
        max_samples_per_micro_batch: Optional[int] = None,
        max_wait_steps: Optional[int] = None,
        dp_group: Any = None,
        even_slots: Optional[bool] = None,
        workload_fn: Optional[WorkloadFn] = None,
        micro_batch_order: str = "pipeline",
        oldest_first: bool = False,
    ) -> None:
        self.max_token_len = int_argument("max_token_len", max_token_len)
        self.num_replicas = int_argument("num_replicas", num_replicas)
        self.micro_batches_per_step = int_argument("micro_batches_per_step", micro_batches_per_step, optional=True,
                                                   expected="None or a positive int")
        self.samples_per_step = int_argument("samples_per_step", samples_per_step, optional=True,
                                             expected="None or a positive int")
        if (self.micro_batches_per_step is None) == (self.samples_per_step is None):
            raise ValueError(
                f"give exactly one of micro_batches_per_step and samples_per_step, got "
                f"micro_batches_per_step={micro_batches_per_step!r}, samples_per_step={samples_per_step!r}"
            )
        if self.micro_batches_per_step is not None and \
                self.micro_batches_per_step * self.num_replicas > MAX_MICRO_BATCHES_PER_STEP:
            raise ValueError(
                f"micro_batches_per_step={self.micro_batches_per_step} on num_replicas={self.num_replicas} ranks is "
                f"{self.micro_batches_per_step * self.num_replicas} micro-batches a step, more than a step can hold "
                f"({MAX_MICRO_BATCHES_PER_STEP}): every step lays out a list per micro-batch; use fewer "
                f"micro-batches per step"
            )
        self.cost_model = as_cost_model(cost_model)
        if self._capacity() < 1:
            model = self.cost_model
            why = (f"the memory model's fixed cost of {model.memory.fixed} leaves nothing of it" if model.memory is not None
                   else f"rounded down to a multiple of pack_round_to={model.pack_round_to} it is 0")
            raise ValueError(
                f"max_token_len={self.max_token_len} leaves no room for any token: {why}; raise max_token_len to at "
                f"least {model.memory.fixed + 1 if model.memory is not None else model.pack_round_to} or lower the "
                f"rounding"
            )
        self.max_samples_per_micro_batch = int_argument(
            "max_samples_per_micro_batch", max_samples_per_micro_batch, optional=True, expected="None or a positive int")
        self.max_wait_steps = int_argument("max_wait_steps", max_wait_steps, optional=True, minimum=0,
                                           expected="None or an int >= 0")
        if dp_group is not None:
            from ..collectives import is_process_group

            if not is_process_group(dp_group):
                raise ValueError(f"dp_group must be a torch.distributed ProcessGroup or None, got {dp_group!r}")
        self.dp_group = dp_group
        if even_slots is not None and not isinstance(even_slots, (bool, np.bool_)):
            raise ValueError(f"even_slots must be None, True or False, got {even_slots!r}")
        self.even_slots = even_slots
        if workload_fn is not None and not callable(workload_fn):
            raise ValueError(f"workload_fn must be None or a callable (lengths -> workloads), got {workload_fn!r:.80}")
        self.workload_fn = workload_fn
        self._workload_digest = workload_digest(workload_fn)  # checks the model on the probe lengths
        self.micro_batch_order = check_micro_batch_order(micro_batch_order)
        self.oldest_first = flag_argument("oldest_first", oldest_first)
        if self.oldest_first and self.samples_per_step is not None:
            raise ValueError(
                f"oldest_first=True is for micro_batches_per_step steps; samples_per_step={self.samples_per_step} "
                f"steps take whole groups oldest first already: drop oldest_first"
            )
        self.steps = 0
        self.oldest_patience = OLDEST_PATIENCE
        self._pool = Pool(self.max_token_len, self.cost_model, self.max_samples_per_micro_batch, self.samples_per_step,
                          workload_fn)
        self._staged: list[Arrivals] = []
        self._witness: Optional[DeadlineWitness] = None
        if self.max_wait_steps is not None and self.micro_batches_per_step is not None:
            self._witness = DeadlineWitness(self.micro_batches_per_step * self.num_replicas, self._capacity(),
                                            self.max_wait_steps, padded=self.cost_model.padded,
                                            max_samples=self.max_samples_per_micro_batch)
        self._next_witness: Optional[np.ndarray] = None

    # -- reading ------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Samples still waiting (added, not yet emitted; with ``dp_group``, this rank's arrivals
        since the last step count once gathered). O(1)."""
        return self._pool.samples

    def __repr__(self) -> str:
        mode = (f"micro_batches_per_step={self.micro_batches_per_step}" if self.samples_per_step is None
                else f"samples_per_step={self.samples_per_step}")
        return (f"<StepPlanner max_token_len={self.max_token_len} num_replicas={self.num_replicas} {mode} "
                f"steps={self.steps} pending={self.pending}>")

    # -- arriving -----------------------------------------------------------------------------

    def add(self, indices: Any, lengths: Any, groups: Optional[Sequence[Hashable]] = None) -> None:
        """Add arrivals to the pool.

        Args:
            indices: a unique int per sample (a dataset row, a rollout id): the steps name
                samples by these.
            lengths: each sample's effective length (what the cost model measures).
            groups: a group id per sample (GRPO: the prompt's uid), or None (a group per
                sample). A group is never split; its samples arrive in one call.

        Raises:
            ValueError: a sample or group over the cap (naming its index and tokens), a group
                of more samples than ``max_samples_per_micro_batch`` or ``samples_per_step``,
                an index already pending or repeated, or (with ``max_wait_steps``) more than
                can be emitted in time. The pool is then unchanged.

        Complexity: O(n) for n arrivals (the pool is joined once per step).
        """
        taken: Optional[set[int]] = None
        if self._staged:
            taken = {i for a in self._staged for i in a.indices.tolist()}
        arrivals = self._pool.prepare(indices, lengths, groups, also_taken=taken)
        if self.dp_group is not None:
            self._staged.append(arrivals)  # checked against everyone's arrivals when gathered
            return
        self._check_admission([arrivals])
        self._pool.commit(arrivals, self.steps)

    def _check_admission(self, incoming: list[Arrivals], what: str = "nothing of this add was added") -> None:
        """The ``max_wait_steps`` bound (see the class docstring), on the pool plus ``incoming``;
        ``what`` ends the message (what was left unchanged)."""
        w = self.max_wait_steps
        if w is None:
            return
        if self.samples_per_step is None:
            limit = (w + 1) * self.micro_batches_per_step * self.num_replicas
            total = self._pool.group_count + sum(a.groups for a in incoming)
            if total > limit:
                raise ValueError(
                    f"max_wait_steps={w}: the pool would hold {total} groups, more than the {limit} "
                    f"((max_wait_steps + 1) x micro_batches_per_step x num_replicas) that can be emitted in time; "
                    f"take a step first ({what})"
                )
            return
        s = self.samples_per_step
        sizes = [a.columns["samples"] for a in incoming]
        first = self._pool.first_group_size()  # with this bound, every pending group has this size
        parts = sizes + ([np.array([first])] if first is not None else [])
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if len(flat) and (int(flat.min()) != int(flat.max()) or s % int(flat[0])):
            raise ValueError(
                f"max_wait_steps={w} with samples_per_step={s} needs groups of one size that divides {s}, got "
                f"group sizes {sorted(set(flat.tolist()))} ({what})"
            )
        total = self._pool.samples + sum(len(a.indices) for a in incoming)
        if total > (w + 1) * s:
            raise ValueError(
                f"max_wait_steps={w}: the pool would hold {total} samples, more than the {(w + 1) * s} "
                f"((max_wait_steps + 1) x samples_per_step) that can be emitted in time; take a step first "
                f"({what})"
            )

    def _facts(self, flush: Any) -> list[tuple[str, Any]]:
        """What every rank of ``dp_group`` must hold alike before a step: the settings, the steps
        taken, the pool, and this call's ``flush`` (a rank that flushes alone would return a
        step its peers do not take)."""
        return [("max_token_len", self.max_token_len), ("num_replicas", self.num_replicas),
                ("micro_batches_per_step", self.micro_batches_per_step), ("samples_per_step", self.samples_per_step),
                ("cost_model", repr(self.cost_model)), ("max_samples_per_micro_batch", self.max_samples_per_micro_batch),
                ("max_wait_steps", self.max_wait_steps), ("oldest_first", self.oldest_first),
                ("steps taken", self.steps),
                ("samples pending", self._pool.samples),
                ("(workload_fn digest on probe lengths, micro_batch_order)", (self._workload_digest, self.micro_batch_order)),
                ("flush", flush)]

    def _gather(self, flush: Any) -> None:
        """With ``dp_group``: every rank's staged arrivals into every rank's pool, in rank order.
        One collective; every check runs on the gathered data, alike on every rank, before any
        rank plans a step."""
        from ..collectives import gather_objects

        facts = self._facts(flush)
        staged, self._staged = self._staged, []  # refused or not, these arrivals leave the stage
        everyone = gather_objects(([value for _, value in facts], staged), self.dp_group)
        message = steps_disagreement([other for other, _ in everyone], [name for name, _ in facts])
        if message is not None:
            raise ValueError(message)
        incoming = [a for _, arrivals in everyone for a in arrivals]
        seen: dict[int, int] = {}
        for rank, (_, arrivals) in enumerate(everyone):
            for a in arrivals:
                for i in a.indices.tolist():
                    if i in seen:
                        raise ValueError(
                            f"index {i} was added by rank {seen[i]} and by rank {rank}; indices must be unique "
                            f"across the ranks of dp_group (this step's arrivals were not added)"
                        )
                    seen[i] = rank
        try:
            self._check_admission(incoming)
        except ValueError as error:
            raise ValueError(f"{error} [the arrivals of every rank since the last step were not added]") from None
        for arrivals in incoming:
            self._pool.commit(arrivals, self.steps)

    # -- planning -----------------------------------------------------------------------------

    def next_step(self, flush: bool = False) -> Optional[Step]:
        """Plan and take the next step.

        Args:
            flush: empty the pool: take what is pending even if it cannot fill a step; ranks
                left without a group get empty micro-batches (dummies, last on their rank), so
                every rank runs the same count. Repeated flushes empty the pool in as few steps
                as the packing allows.

        Returns:
            ``step[rank][micro_batch]``: ascending sample indices, or None when the pool cannot
            fill a step (fewer than ``K * num_replicas`` groups, or fewer than ``S`` samples
            that make whole groups) and ``flush`` is False, or when it is empty. None takes no
            step; the samples keep waiting.

        Guarantees of every step: every micro-batch within the cap (and the sample cap); every
        rank the same number of micro-batches (``K``, or the schedule's count); groups whole;
        every sample emitted exactly once over the steps; deterministic.

        Raises:
            ValueError: ``flush`` not a bool; with ``dp_group``, a disagreement of the ranks
                (settings, steps taken, ``flush``, a ``num_replicas`` other than the group's
                size), an index added on two ranks, or the ``max_wait_steps`` bound, on every
                rank alike and before any rank takes the step.

        Complexity: K mode O(p) NumPy work on a pool of p groups plus O(c * K * R) for the c
        groups it visits; S mode O(p) plus O(c log c) on the c chosen groups and at most
        p / :data:`SAMPLES_PER_TRADE` trade attempts of the slot evening (or, where the lower
        bound is not reached, :func:`seqbal.build_dp_schedule` on the S samples).
        """
        if self.dp_group is not None:
            try:
                flush = flag_argument("flush", flush)
            except ValueError as error:  # agreed in the gather: every rank raises, none waits
                flush = str(error)  # a message, never a bool: the peers see this rank's error
            self._gather(flush)
        flush = flag_argument("flush", flush)
        self._pool.consolidate()
        if self.samples_per_step is None:
            chosen = self._fixed_count_step(flush)
        else:
            chosen = self._fixed_samples_step(flush)
        if chosen is None:
            return None
        positions, layout = chosen
        members = self._pool.take(positions)
        if self._witness is not None:
            self._witness.take(self._next_witness if self._next_witness is not None else np.zeros(0, dtype=np.int64))
            self._next_witness = None
        of = dict(zip(positions, members))
        step = [[np.sort(np.concatenate([of[g] for g in mb])).tolist() if mb else [] for mb in rank] for rank in layout]
        self.steps += 1
        return step

    def _capacity(self) -> int:
        return self.max_token_len if self.cost_model.padded else self.cost_model.token_capacity(self.max_token_len)

    def _fixed_count_step(self, flush: bool) -> Optional[tuple[list[int], list[list[list[int]]]]]:
        pool, k, ranks = self._pool, self.micro_batches_per_step, self.num_replicas
        columns = pool.columns
        groups = len(columns["samples"])
        count = k * ranks
        if groups == 0 or (groups < count and not flush):
            return None
        def fill(mandatory: int, quota: Optional[tuple[int, int]] = None) -> Optional[list[list[int]]]:
            return fill_bins(columns["cost"], columns["samples"], columns["longest"], count, self._capacity(),
                             mandatory=mandatory, padded=self.cost_model.padded,
                             max_samples=self.max_samples_per_micro_batch, quota=quota,
                             oldest_only=self.oldest_first)

        if self.max_wait_steps is not None and groups > count:
            bins = self._within_deadlines(count, fill)
        else:
            bins = fill(self._mandatory(count))
        even = self.even_slots
        if even is None:
            even = pool.samples >= EVEN_SLOTS_MIN_SAMPLES * count
        return self._laid_out([b for b in bins if b], k, even)

    def _mandatory(self, count: int) -> int:
        """How many of the oldest groups a ``K`` step without ``max_wait_steps`` must take: every
        group of a pool that cannot fill the step; else the oldest group once it has waited
        :attr:`oldest_patience` steps (so none waits for ever), else none. (With
        :attr:`oldest_first` the fill itself takes the ``count`` oldest groups.) O(1)."""
        groups = self._pool.group_count
        if groups <= count:
            return groups
        return int(self.steps - int(self._pool.columns["born"][0]) >= self.oldest_patience)

    def _within_deadlines(self, count: int, fill: Any) -> list[list[int]]:
        """A ``K`` step's micro-batches under ``max_wait_steps``, and the witness for what it
        leaves (:mod:`seqbal.stream.deadlines`), kept for :meth:`next_step` to install.

        The step's usual fill with the groups due now placed first (where they are at most one
        per micro-batch), if what it leaves still has a witness from the next step on. Otherwise
        later deadlines ask for more than the groups due now, and the fullest of these whose
        leftover keeps a witness is taken: the fewest oldest groups that do (a bisection), the
        witness's own step packed afresh, and that step as it is (always: its leftover keeps the
        witness's later steps), each topped up with whatever else fits. O(p x (w + 1) x count)
        NumPy work per witness check at worst on a pool of ``p`` groups, and O(log p) checks."""
        witness, columns, now = self._witness, self._pool.columns, self.steps
        witness.place_new(columns, now)
        due = witness.due_now(columns, now)
        if due <= count:  # the usual fill, where what it leaves keeps a witness
            bins = fill(due)
            rest = None if bins is None else witness.after_taking(columns, _members(bins), now)
            if rest is not None:
                self._next_witness = rest
                return bins
        own_step = witness.step_bins(now)
        topped = dict(padded=self.cost_model.padded, max_samples=self.max_samples_per_micro_batch)
        cost, samples, longest, capacity = columns["cost"], columns["samples"], columns["longest"], self._capacity()

        def oldest(m: int) -> Optional[list[list[int]]]:
            return top_up_bins(cost, samples, longest, count, capacity, must=range(m), **topped)

        def kept(bins: Optional[list[list[int]]]) -> Optional[np.ndarray]:
            return None if bins is None else witness.after_taking(columns, _members(bins), now)

        # Later deadlines can ask for more than the groups due now: the fewest oldest groups
        # whose fill keeps a witness (a bisection between the due groups and the most that pack),
        # the witness's own step packed afresh, and that step as it is; each topped up.
        low, high = due, len(cost) + 1
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if oldest(middle) is not None else (low, middle)
        options: list[tuple[list[list[int]], np.ndarray]] = []
        low, high = due - 1, low
        bins = oldest(high)
        if bins is not None and (rest := kept(bins)) is not None:
            best = (bins, rest)
            while high - low > 1:
                middle = (low + high) // 2
                bins = oldest(middle)
                rest = kept(bins)
                if rest is None:
                    low = middle
                else:
                    high, best = middle, (bins, rest)
            options.append(best)
        for bins in (top_up_bins(cost, samples, longest, count, capacity, must=_members(own_step), **topped),
                     top_up_bins(cost, samples, longest, count, capacity, seeded=own_step, **topped)):
            if bins is not None and (rest := kept(bins)) is not None:
                options.append((bins, rest))
        if not options:  # the last: the witness's later steps, unchanged, are one
            raise RuntimeError("internal error: the deadline witness lost its later steps; please report")
        bins, self._next_witness = max(options, key=lambda option: _placed(option[0], cost))
        return bins

    def _laid_out(self, bins: list[list[int]], per_rank: int, even: bool = True, balance: bool = True,
                  budget: Optional[int] = None) -> tuple[list[int], list[list[list[int]]]]:
        """Pool positions of the step's groups, and their layout as ``[rank][slot]`` of pool
        positions; ``balance=False``: ``bins`` are balanced already, only laid out; ``budget``:
        the evening's trade attempts, at most."""
        columns = self._pool.columns
        positions = sorted(g for b in bins for g in b)
        local = {g: i for i, g in enumerate(positions)}
        where = np.asarray(positions, dtype=np.int64)
        tokens, work, samples = columns["tokens"][where], columns["work"][where], columns["samples"][where]
        parts = [[local[g] for g in b] for b in bins]
        total = per_rank * self.num_replicas
        if balance and total <= len(positions):  # enough groups for every micro-batch: none left empty
            cost = columns["cost"][where]
            balanced = None
            if not self.cost_model.padded:  # the same groups, re-partitioned for even workloads within the cap
                balanced = capped_balanced_partitions(cost, work, self._capacity(), total, feasible=parts)
                if balanced is not None and self.max_samples_per_micro_batch is not None and not within_sample_cap(
                        balanced, samples, self.max_samples_per_micro_batch):
                    balanced = None
            if balanced is not None:
                parts = balanced
            elif len(parts) < total:
                parts = split_bins_to_count(parts, cost, total, weights=work)
        layout = layout_bins(parts, tokens, work, samples, self.cost_model.token_capacity(self.max_token_len),
                             self.num_replicas, per_rank, padded=self.cost_model.padded,
                             max_samples=self.max_samples_per_micro_batch, even=even, budget=budget,
                             order=self.micro_batch_order, longest=columns["longest"][where])
        return positions, [[[positions[g] for g in mb] for mb in rank] for rank in layout]

    def _fixed_samples_step(self, flush: bool) -> Optional[tuple[list[int], list[list[list[int]]]]]:
        from ..schedule import build_dp_schedule

        pool, target = self._pool, self.samples_per_step
        columns = pool.columns
        if pool.samples == 0 or (pool.samples < target and not flush):
            return None
        chosen = exact_selection(columns["samples"], target, exact=True)
        if chosen is None:
            if not flush:
                return None
            chosen = exact_selection(columns["samples"], target, exact=False)
        where = np.asarray(chosen, dtype=np.int64)
        ranks = self.num_replicas
        if len(chosen) >= ranks:
            fewest = self._at_lower_bound(chosen)
            if fewest is not None:
                return fewest
            offsets = pool.offsets()
            sizes = columns["samples"][where]
            sample_pos = np.concatenate([np.arange(offsets[g], offsets[g] + sizes[i]) for i, g in enumerate(chosen)])
            group_of = np.repeat(np.arange(len(chosen)), sizes)
            try:
                schedule = build_dp_schedule(
                    pool.lengths[sample_pos], ranks, self.max_token_len, group_ids=group_of.tolist(),
                    cost_model=self.cost_model, max_samples_per_micro_batch=self.max_samples_per_micro_batch,
                    workload_fn=self.workload_fn, micro_batch_order=self.micro_batch_order,
                )
            except ValueError:  # too few groups for the count every rank needs: dummies below
                schedule = None
            if schedule is not None:
                layout = [[sorted({chosen[int(group_of[i])] for i in mb}) for mb in rank]
                          for rank in schedule.micro_batches]
                return sorted(chosen), layout
        # Fewer groups than the ranks need: the fewest micro-batches (best fit), dummies for the rest.
        bins = fill_bins(columns["cost"][where], columns["samples"][where], columns["longest"][where], len(chosen),
                         self._capacity(), mandatory=len(chosen), padded=self.cost_model.padded,
                         max_samples=self.max_samples_per_micro_batch)
        bins = [[chosen[i] for i in b] for b in bins if b]
        return self._laid_out(bins, ceildiv(len(bins), ranks))

    def _at_lower_bound(self, chosen: list[int]) -> Optional[tuple[list[int], list[list[list[int]]]]]:
        """An ``S`` step's groups at the count no plan can go below, or None to plan them with
        :func:`seqbal.build_dp_schedule`.

        The count is the packing lower bound of the chosen groups (and the bound on samples under
        the sample cap), rounded up to a multiple of the ranks: no plan has fewer micro-batches,
        and ``build_dp_schedule`` tries this count first with the same partitioner, so where one
        capped balanced partition reaches it, the count is the schedule's (never more) with no
        search for it (the schedule would also pack, and align a second candidate partition, to
        find the same count). The partition's heaviest micro-batch is then lowered further
        (:func:`seqbal.partition.rebalance_within_capacity`, to within
        :data:`seqbal.schedule.slots.SLOT_CLOSE_ENOUGH`) and it is laid out as a ``K`` step is,
        its slots evened with at most one trade attempt per :data:`SAMPLES_PER_TRADE` pending
        samples (``even_slots=True``: the evening's own
        bound; False: none), which keeps a step's cost a bounded number of best-fit-decreasing
        passes over the pool. Padded and memory cost models, and a partition that misses the
        count or the sample cap, go to ``build_dp_schedule``: the count is then its count.
        O(c log c) on the ``c`` chosen groups, plus the evening.
        """
        model = self.cost_model
        if model.padded or model.memory is not None:
            return None
        columns, ranks, max_samples = self._pool.columns, self.num_replicas, self.max_samples_per_micro_batch
        where = np.asarray(chosen, dtype=np.int64)
        tokens, work, samples = columns["tokens"][where], columns["work"][where], columns["samples"][where]
        capacity = max(self._capacity(), 1)
        bound = max(packing_lower_bound(tokens, capacity), ranks)
        if max_samples is not None:
            bound = max(bound, sample_count_bound(samples, max_samples))
        count = roundup_divisible(bound, ranks)
        if count > len(chosen):
            return None
        parts = capped_balanced_partitions(tokens, work, capacity, count)
        if parts is None or (max_samples is not None and not within_sample_cap(parts, samples, max_samples)):
            return None
        # twice the partitioner's own step limit, to the evening's closeness: the fewer trades
        # the bounded evening then needs (a rebalance step costs a fraction of a trade)
        tighter = rebalance_within_capacity(parts, tokens, work, capacity, max_steps=4 * count + 64,
                                            close_enough=SLOT_CLOSE_ENOUGH - 1)
        if max_samples is None or within_sample_cap(tighter, samples, max_samples):
            parts = tighter
        budget = None if self.even_slots else self._pool.samples // SAMPLES_PER_TRADE
        positions, layout = self._laid_out([[chosen[i] for i in part] for part in parts], count // ranks,
                                           even=self.even_slots is not False, balance=False, budget=budget)
        layout.sort(key=lambda rank: min(min(mb) for mb in rank))  # the oldest group on rank 0, as the schedule
        return positions, layout

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The planner's whole state (plain lists and ints): the steps taken and the pool.
        With ``dp_group``, take it right after :meth:`next_step` (arrivals staged since are
        this rank's own and are not included). O(pool)."""
        state = {"version": 1, "steps": self.steps, "pool": self._pool.state()}
        if self._witness is not None:
            state["witness"] = self._witness.slots.tolist()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output: the next steps are those the saved planner would
        have taken. O(pool).

        >>> a = StepPlanner(10, 1, micro_batches_per_step=1); a.add([1, 2, 3], [4, 5, 6])
        >>> b = StepPlanner(10, 1, micro_batches_per_step=1); b.load_state_dict(a.state_dict())
        >>> a.next_step() == b.next_step(), b.pending
        (True, 1)
        """
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError(f"not a StepPlanner state (version 1): {type(state).__name__}")
        for key in ("steps", "pool"):
            if key not in state:
                raise ValueError(f"state has no {key!r}: not a StepPlanner state")
        steps = int_argument("state['steps']", state["steps"], minimum=0, expected="an int >= 0")
        pool = copy.copy(self._pool)
        pool.load(state["pool"])  # checked first: a bad state leaves the planner as it was
        born = pool.columns["born"]
        if len(born) and int(born.max()) > steps:
            raise ValueError(f"state['pool']['born'] holds step {int(born.max())}, after the {steps} steps taken "
                             f"(state['steps']): a sample cannot have arrived after a step not yet taken")
        w = self.max_wait_steps
        if w is not None and len(born) and steps > int(born.min()) + w:
            raise ValueError(
                f"state['pool']['born']: a group that arrived before step {int(born.min())} is still pending after "
                f"{steps} steps (state['steps']), beyond max_wait_steps={w}: the state breaks the wait promise")
        previous, self._pool = self._pool, pool
        try:
            self._check_admission([], what="the state was not loaded")
        except ValueError as error:
            raise ValueError(f"state['pool']: {error}") from None
        finally:
            self._pool = previous
        witness = self._loaded_witness(state, pool, steps)
        self._pool, self.steps, self._staged = pool, steps, []
        if self._witness is not None:
            self._witness.take(witness)
        self._next_witness = None

    def _loaded_witness(self, state: dict[str, Any], pool: Pool, steps: int) -> np.ndarray:
        """The deadline witness of a state (``max_wait_steps`` with ``micro_batches_per_step``):
        its ``witness`` checked (a ``ValueError`` naming ``state['witness']`` if it is not one),
        and slots for the groups it has none for (every group of a state saved before the
        planner kept one): a ``ValueError`` if they fit nowhere in time."""
        if self._witness is None:  # no deadline to keep: a saved witness says nothing to this planner
            return np.zeros(0, dtype=np.int64)
        columns, w = pool.columns, self._witness
        loaded = DeadlineWitness(w.count, w.capacity, w.wait, padded=w.padded, max_samples=w.max_samples)
        if "witness" in state:
            slots = int_array(state["witness"], "state['witness']", integral_floats=False, negative=True, sums=False)
            why = w.check(columns, slots, steps)
            if why is not None:
                raise ValueError(f"state['witness'] {why}: not a deadline witness of this pool under these settings")
            loaded.take(slots)
        try:  # the groups it has no slot for yet (all of them in a state saved without one)
            loaded.place_new(columns, steps)
        except RuntimeError:
            raise ValueError(f"state['pool']: its groups cannot all leave by their max_wait_steps={self.max_wait_steps} "
                             f"deadlines in {w.count} micro-batch(es) a step: the state breaks the wait promise") from None
        return loaded.slots
