"""A token-budget batch sampler for a map-style dataset, and offline packing into rows: planning
on the dataset's global lengths, the same on every rank.

Why a fixed count with a fresh mix: transformers' ``Trainer`` reads ``len()`` of the training
dataloader once, before the first epoch, and then takes exactly that many batches
(``gradient_accumulation_steps`` per optimizer step) in every epoch. A plan whose count changed
with the shuffle would leave a rank short of a batch (a hang in the gradient all-reduce) or skip
data. But a plan made once and only relabelled keeps the same lengths together for the whole
run, and SGD wants a fresh random mix every epoch. So the count is fixed once, when the sampler
is built, and every epoch draws a new random partition at exactly that count
(:mod:`seqbal.partition.fresh_mix`): noisy-decreasing LPT dealing, then best fit for what is
left, then swaps of near-equal items between micro-batches that keep every micro-batch's load
where the deal put it (they break the pairs the deal's order repeats where micro-batches hold
few items), then slots of similar work dealt to the ranks. The count: best-fit decreasing (BFD)
gives a near-optimal one, rounded up to a multiple of ``num_replicas x gradient_accumulation_steps``
(where it is more than 1% above the packing lower bound, as with large forced groups, the
count of :func:`seqbal.build_dp_schedule` where that is lower: the tight count); if a fresh
draw fits at that count it is the count, else the next multiple within 1% above it where a
deal fits. Where no deal fits (inputs where only a tight packing fits: samples near the cap,
uniform lengths up to the cap, large forced groups), the draw is a noisy best fit or, failing
that, the tight plan itself, each then re-mixed by random swaps of items of similar size
between micro-batches that keep every one within the cap
(:func:`~seqbal.partition.fresh_mix.swap_mix`): a fresh partition at the tight count, always.
Only the padded cost keeps one tight plan, relabelled every epoch, since its micro-batches
must hold similar lengths.

Every rank computes the same plan from the same global lengths and settings, deterministically
by ``(seed, epoch)``. Where torch.distributed is initialised and the sampler's process group
has more than one rank, the sampler proves that with one small all-reduce when it is built
(:mod:`seqbal.epochs.agreement`), whatever its arguments say: a rank whose lengths differ by one
token, that believes it is alone (``num_replicas=1``) or that passes a peer's ``rank`` is an
error on every rank, not a silent loss of data or a hang.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from ..cost import CostModel, as_cost_model
from ..partition.fresh_mix import deal_slots, fresh_mix_bins, noisy_best_fit_bins, swap_mix, swap_rounds
from ..partition.parts import _assignment_from_groups, _groups_from_assignment
from ..schedule.inputs import raise_if_over
from ..validation import int_argument, int_array, is_int
from ..order import check_micro_batch_order, order_code
from ..workload import WorkloadFn, checked_workloads, workload_digest
from .agreement import agree_or_raise, digest


def _workload_setting(workload_fn: Optional[WorkloadFn], lengths: np.ndarray) -> tuple[int, Optional[np.ndarray]]:
    """What the ranks compare of ``workload_fn`` (a 63-bit digest of its workloads on the fixed
    probe lengths, and with a model of the caller's on the dataset's lengths too), and those
    workloads (None for the default model, computed where needed). ValueError: not a callable,
    or workloads that fail :func:`seqbal.workload.checked_workloads`. O(n) with a model."""
    if workload_fn is None:
        return workload_digest(None), None
    if not callable(workload_fn):
        raise ValueError(f"workload_fn must be None or a callable (lengths -> workloads), got {workload_fn!r:.80}")
    workloads = checked_workloads(lengths, workload_fn)
    return digest((workload_digest(workload_fn), digest(workloads))), workloads

__all__ = ["TokenBudgetBatchSampler", "pack_rows", "FRESH_COUNT_SLACK", "DEAL_SWAP_BAND", "DRAWS"]

#: How far above the tight count (BFD's, or the schedule's) the fresh mix's count may go: 1%.
FRESH_COUNT_SLACK = 0.01
#: After a deal, swaps of items of near-equal size move each micro-batch's load by at most this
#: share of the cap (1%): the deal's order leaves the same tight pairs on inputs with few items
#: per micro-batch (uniform lengths up to the cap), and these swaps break them while every
#: micro-batch keeps about the load the deal gave it (the per-step balance of its slots).
DEAL_SWAP_BAND = 0.01
#: The random draws an epoch tries, in order: two LPT deals
#: (:func:`~seqbal.partition.fresh_mix.fresh_mix_bins`), then noisy best fits
#: (:func:`~seqbal.partition.fresh_mix.noisy_best_fit_bins`, with this noise) for inputs too
#: tight for a deal, then the tight plan; the last three re-mixed by
#: :func:`~seqbal.partition.fresh_mix.swap_mix` (the last always fits). A deal is re-mixed
#: too, but only by swaps that keep every micro-batch within :data:`DEAL_SWAP_BAND` of its dealt
#: load: the deal's balanced slots stay balanced.
DRAWS = (("deal", 0.0), ("deal", 0.0), ("best fit", 0.1), ("best fit", 0.03), ("swaps", 0.0))


def _default_replicas(num_replicas: Optional[int], rank: Optional[int], process_group: Any = None) -> tuple[int, int]:
    """torch's ``DistributedSampler`` defaults, taken from ``process_group`` (None: the default
    group): its size and this process's rank in it, or one process without an initialised
    torch.distributed."""
    if num_replicas is None or rank is None:
        initialised = False
        try:
            import torch.distributed as dist

            initialised = dist.is_available() and dist.is_initialized()
        except ImportError:  # pragma: no cover - torch ships torch.distributed
            pass
        if num_replicas is None:
            num_replicas = dist.get_world_size(process_group) if initialised else 1
        if rank is None:
            rank = dist.get_rank(process_group) if initialised else 0
    num_replicas = int_argument("num_replicas", num_replicas)
    if not is_int(rank) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be an int in [0, {num_replicas}) (num_replicas={num_replicas}), got {rank!r}")
    return num_replicas, int(rank)


def _epoch_argument(epoch: Any, where: str) -> int:
    """An epoch number checked: an int >= 0 (Python or NumPy), else a ``ValueError`` naming
    ``where`` (``set_epoch``). O(1)."""
    if not is_int(epoch) or epoch < 0:
        raise ValueError(f"{where}: epoch must be an int >= 0, got {epoch!r}")
    return int(epoch)


class _Items:
    """The dataset as forced groups ("items"): their cost against the cap, their workload, and
    the check that each fits, with messages naming the caller's own cap argument."""

    def __init__(self, lengths: np.ndarray, cap: int, cap_name: str, cost: CostModel, group_size: int,
                 workloads: Optional[np.ndarray] = None) -> None:
        n = len(lengths)
        if n % group_size:
            raise ValueError(f"force_group_size={group_size} does not divide the dataset's {n} samples")
        self.group_size = group_size
        # What each sample adds to a micro-batch's cost: its rounded length (its bytes under a
        # memory cost); the padded cost is not additive and keeps the rounded lengths.
        measured = cost.rounded(lengths) if cost.padded else cost.sample_costs(lengths)
        under = "" if cost.is_default else f" under the {cost}"
        capacity = cost.sample_capacity(cap)
        raise_if_over(measured, capacity, lambda first, count: (
            f"sample {first} has {int(lengths[first])} tokens{under}, which exceeds {cap_name}={cap} "
            f"({count} sample(s) over the cap, the largest has {int(lengths.max())}): raise {cap_name} to at "
            f"least {cost.cost([int(lengths[int(np.argmax(measured))])])} or drop or truncate those samples"
        ))
        self.costs = cost.group_costs(lengths, group_size)  # each group alone as a micro-batch
        raise_if_over(self.costs, capacity, lambda first, _: (
            f"forced group exceeds {cap_name}: group {first} (samples {first * group_size}.."
            f"{first * group_size + group_size - 1}) costs {int(self.costs[first])}{under} > {cap_name}={cap}; "
            f"raise {cap_name} to at least {int(self.costs.max())} or use a smaller force_group_size"
        ))
        # Additive costs for the token model: a micro-batch's rounded tokens, under the cap's
        # packed rounding (the token model reduces to tokens under a smaller capacity).
        self.additive = None if cost.padded else measured.reshape(-1, group_size).sum(axis=1)
        self.capacity = capacity if cost.padded else max(cost.token_capacity(cap), 1)
        from ..workload import calculate_workload

        #: Groups of one key can trade places without changing any micro-batch's cost.
        self.trade_key = self.additive if self.additive is not None else measured.reshape(-1, group_size).max(axis=1)
        if workloads is None:
            workloads = calculate_workload(lengths)
        self.workloads = np.asarray(workloads, dtype=np.float64).reshape(-1, group_size).sum(axis=1)

    def __len__(self) -> int:
        return len(self.costs)


def _bins_to_samples(bins: np.ndarray, grid_rows: Sequence[np.ndarray], group_size: int) -> list[list[list[int]]]:
    """For each row of bin ids, the ascending sample indices of each of its bins, in that
    order. O(n log n), one sort whatever the number of rows."""
    order = np.argsort(bins, kind="stable")  # items by bin, ascending within a bin
    sorted_bins = bins[order]
    offsets = np.arange(group_size)
    result = []
    for row in grid_rows:
        starts = np.searchsorted(sorted_bins, row, side="left").tolist()
        ends = np.searchsorted(sorted_bins, row, side="right").tolist()
        result.append([(order[a:b, None] * group_size + offsets).reshape(-1).tolist() for a, b in zip(starts, ends)])
    return result


class TokenBudgetBatchSampler:
    """Index lists for ``DataLoader(dataset, batch_sampler=...)``: micro-batches under a token cap,
    the same number on every rank and in every epoch, balanced slot by slot, a fresh random mix
    every epoch.

    Guarantees (for the chosen cost model, on every rank, every epoch):

    - every micro-batch costs at most ``max_token_len`` (and holds at most
      ``max_samples_per_micro_batch`` samples, where given); an impossible cap is a ``ValueError``
      naming the sample, its tokens and the cap, raised here, when the sampler is built;
    - ``len(self)`` is the exact number of micro-batches each rank yields per epoch, the same on
      every rank and in every epoch, a multiple of ``gradient_accumulation_steps``, and at most
      1% above a best-fit-decreasing packing's count (rounded up to that multiple), or above
      :func:`seqbal.build_dp_schedule`'s where that one is lower and BFD's is more than 1% above
      the packing lower bound;
    - every sample appears exactly once per epoch over all ranks; samples ``i*g .. i*g+g-1``
      (``g = force_group_size``) share a micro-batch;
    - rank ``r``'s ``i``-th micro-batch is slot ``i`` on every rank: the slot's micro-batches
      carry similar work;
    - every epoch is a new random partition of the samples (``mix == "fresh"``; the padded
      cost keeps one tight plan, ``mix == "fixed"``, see the module docstring), deterministic by
      ``seed`` and epoch: iterating again gives the same batches, so skipping the first ``k``
      (transformers does on resume) leaves exactly the remaining ones;
    - where torch.distributed is initialised and ``process_group`` has more than one rank
      (whatever ``num_replicas`` says), every rank of it has checked, in one all-reduce here,
      that all ranks passed the same lengths and settings, that ``num_replicas`` is the group's
      size and that each rank passed its own ``rank``; if not, every rank raises the same
      ``ValueError`` (what differs, the first differing sample, the two ranks that passed one
      ``rank``). Build the sampler on every rank of that group.

    Args:
        lengths: the tokens of every sample of the dataset (all ranks' samples, the same list on
            every rank).
        max_token_len: hard cap on a micro-batch's cost.
        num_replicas: data-parallel ranks; default ``process_group``'s size (1 without
            torch.distributed). In a process group of several ranks it must be the group's size.
        rank: this rank, in ``[0, num_replicas)``; default its rank in ``process_group`` (0).
        seed: shuffle seed (combined with the epoch).
        shuffle: False: the same micro-batches every epoch (the first epoch's), heaviest slot
            first.
        cost_model: :class:`seqbal.CostModel` or its name (``"padded"`` when the collator pads);
            default the token cost (padding-free collation).
        force_group_size: consecutive samples that must share a micro-batch.
        gradient_accumulation_steps: the count per rank is made a multiple of this.
        max_samples_per_micro_batch: a second hard cap, on the samples of every micro-batch;
            default None (as many as fit the tokens).
        process_group: the ranks that build this sampler and check each other's inputs, one
            per replica; default the default process group. With tensor or pipeline
            parallelism, pass the data-parallel group (the ranks that split the data).
        workload_fn: what the slots balance (lengths -> non-negative workloads, as in
            :func:`seqbal.plan_micro_batches`); default None: :func:`seqbal.calculate_workload`.
            Every rank must pass the same model: its workloads on fixed probe lengths and on the
            dataset's lengths are part of the inputs the ranks compare.
        micro_batch_order: None (default): the slots of an epoch in random order (heaviest first
            without ``shuffle``). ``"pipeline"`` or ``"largest_first"`` (:mod:`seqbal.order`):
            the slots of every optimizer step (each run of ``gradient_accumulation_steps``
            slots, still a random mix) in that order, the same on every rank. Compared across
            ranks with the other settings.

    Complexity: building costs one BFD pass over the groups plus one or two random draws
    (O(n log K) in NumPy each) and a digest of the lengths; an epoch's plan is one or two draws;
    memory O(n). On inputs too tight for a deal, a draw is a noisy best fit (O(n log n) in
    Python) or the tight plan, then the swaps (O(r n log n) in NumPy, ``r`` rounds: 24, up to
    400 on small inputs), and building may run :func:`seqbal.build_dp_schedule` once. With the
    padded cost or a sample cap, the tight plan is
    :func:`seqbal.build_dp_schedule`'s.

    Examples:
        >>> sampler = TokenBudgetBatchSampler([5, 3, 7, 2, 8, 1], 10, num_replicas=2, rank=0, shuffle=False)
        >>> len(sampler), [sum([5, 3, 7, 2, 8, 1][i] for i in mb) <= 10 for mb in sampler]
        (2, [True, True])
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_token_len: int,
        *,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        seed: int = 0,
        shuffle: bool = True,
        cost_model: Union[None, str, Any] = None,
        force_group_size: int = 1,
        gradient_accumulation_steps: int = 1,
        max_samples_per_micro_batch: Optional[int] = None,
        process_group: Any = None,
        workload_fn: Optional[WorkloadFn] = None,
        micro_batch_order: Optional[str] = None,
    ) -> None:
        error: Optional[BaseException] = None
        array: Optional[np.ndarray] = None
        workloads: Optional[np.ndarray] = None
        settings: dict[str, Optional[int]] = dict.fromkeys(
            ("max_token_len", "cost_model", "force_group_size", "gradient_accumulation_steps",
             "max_samples_per_micro_batch", "seed", "shuffle", "num_replicas", "workload_fn", "micro_batch_order"))
        num_replicas_checked = rank_checked = None
        try:  # every local check first, so that an error here is agreed with the other ranks
            self.num_replicas, self.rank = _default_replicas(num_replicas, rank, process_group)
            num_replicas_checked, rank_checked = self.num_replicas, self.rank
            settings["num_replicas"] = self.num_replicas
            self.max_token_len = int_argument("max_token_len", max_token_len)
            settings["max_token_len"] = self.max_token_len
            self.cost_model = as_cost_model(cost_model)
            settings["cost_model"] = digest(repr(self.cost_model))
            self.force_group_size = int_argument("force_group_size", force_group_size)
            settings["force_group_size"] = self.force_group_size
            self.gradient_accumulation_steps = int_argument("gradient_accumulation_steps", gradient_accumulation_steps)
            settings["gradient_accumulation_steps"] = self.gradient_accumulation_steps
            self.max_samples_per_micro_batch = int_argument(
                "max_samples_per_micro_batch", max_samples_per_micro_batch, optional=True)
            settings["max_samples_per_micro_batch"] = self.max_samples_per_micro_batch or 0
            self.seed = int_argument("seed", seed, minimum=None, maximum=None, expected="an int")
            settings["seed"] = digest(self.seed)
            if not isinstance(shuffle, (bool, np.bool_)):
                raise ValueError(f"shuffle must be True or False, got {shuffle!r}")
            self.shuffle = bool(shuffle)
            settings["shuffle"] = int(self.shuffle)
            array = int_array(lengths, "lengths", samples=True, integral_floats=False,
                              empty="lengths is empty: the dataset has no sample to plan")
            settings["workload_fn"], workloads = _workload_setting(workload_fn, array)
            self.micro_batch_order = None if micro_batch_order is None else check_micro_batch_order(micro_batch_order)
            settings["micro_batch_order"] = 0 if micro_batch_order is None else 1 + order_code(micro_batch_order)
        except ValueError as caught:
            error = caught
        agree_or_raise(list(settings.items()), array, error, process_group, who="TokenBudgetBatchSampler",
                       num_replicas=num_replicas_checked, rank=rank_checked, ranked=True)
        # Past this point every rank holds the same inputs: what follows is the same everywhere,
        # errors included, so a rank can raise without leaving another in a collective.
        self.lengths = array
        self.workload_fn = workload_fn
        self.epoch = 0
        self._items = _Items(array, self.max_token_len, "max_token_len", self.cost_model, self.force_group_size, workloads)
        self._plan_count()

    # --- the count, fixed once ---------------------------------------------------------------

    @property
    def _unit(self) -> int:
        return self.num_replicas * self.gradient_accumulation_steps

    @property
    def _max_items(self) -> Optional[int]:
        if self.max_samples_per_micro_batch is None:
            return None
        return self.max_samples_per_micro_batch // self.force_group_size

    def _cannot_satisfy(self, needed: int) -> ValueError:
        return ValueError(
            f"Cannot satisfy max_token_len={self.max_token_len} with num_replicas={self.num_replicas} and "
            f"gradient_accumulation_steps={self.gradient_accumulation_steps}: every rank needs a multiple of "
            f"{self.gradient_accumulation_steps} micro-batches, {needed} in all, each holding at least one "
            f"{'forced group' if self.force_group_size > 1 else 'sample'}, but the dataset has only "
            f"{len(self._items)}: use fewer ranks or gradient accumulation steps, or more data"
        )

    def _plan_count(self) -> None:
        """Fix the count (micro-batches over all ranks) and the tight plan; decide the mix."""
        items, unit = self._items, self._unit
        max_items = self._max_items
        if max_items is not None and max_items < 1:
            raise ValueError(
                f"max_samples_per_micro_batch={self.max_samples_per_micro_batch} is smaller than "
                f"force_group_size={self.force_group_size}: a forced group cannot fit"
            )
        self._tight_grid: Optional[np.ndarray] = None
        if items.additive is None or max_items is not None:
            self._tight_from_schedule()
        else:
            from ..partition import best_fit_decreasing_partitions

            packing = best_fit_decreasing_partitions(items.additive, items.capacity)
            count = -(-len(packing) // unit) * unit
            if count > len(items):
                raise self._cannot_satisfy(count)
            from ..partition.packing import split_bins_to_count

            packing = split_bins_to_count(packing, items.additive, count) if count > len(packing) else packing
            self._tight_bins = _assignment_from_groups(packing, len(items))
            self.count = count
            if not self._near_bound(count):
                # BFD is more than FRESH_COUNT_SLACK above what any plan needs (large forced
                # groups): the schedule's count search, kept where it plans fewer
                bins, cached = self._tight_bins, self.count
                self._tight_from_schedule()
                self._tight_grid = None  # fresh draws deal their own slots
                if self.count >= cached:
                    self._tight_bins, self.count = bins, cached
        self.mix = "fixed"
        if items.additive is None:
            return  # the padded cost: a fresh mix of lengths would multiply the padding
        # The deal mixes best and is the cheapest draw: at the tight count, else up to 1% above
        # it; then the noisy best fits at the tight count. The first that fits fixes the count,
        # and later epochs try its kind of draw first.
        tries = [(self.count, 0)]
        slack = int(self.count * (1 + FRESH_COUNT_SLACK)) // unit * unit
        if slack > self.count and slack <= len(items):
            tries.append((slack, 0))
        tries += [(self.count, attempt) for attempt, (kind, _) in enumerate(DRAWS) if kind != "deal"]
        for count, attempt in tries:
            bins = self._draw(count, 0, attempt)
            if bins is not None:
                if count > self.count:  # the tight plan is split up to the fresh count
                    self._grow_tight(count)
                self.count, self.mix, self._first_draw = count, "fresh", attempt
                self._epoch0 = bins
                return

    def _near_bound(self, count: int) -> bool:
        """Whether ``count`` is within :data:`FRESH_COUNT_SLACK` of the lower bound no plan can go
        below (rounded up to the ranks x steps): the cheap bound first, then the stronger one."""
        items, unit = self._items, self._unit

        def rounded(bound: int) -> int:
            return -(-bound // unit) * unit

        if count <= rounded(-(-int(items.additive.sum()) // items.capacity)) * (1 + FRESH_COUNT_SLACK):
            return True
        from ..partition import packing_lower_bound

        return count <= rounded(packing_lower_bound(items.additive, items.capacity)) * (1 + FRESH_COUNT_SLACK)

    def _tight_from_schedule(self) -> None:
        """The tight plan from :func:`seqbal.build_dp_schedule` (padded cost, sample cap)."""
        from ..schedule import build_dp_schedule

        try:
            schedule = build_dp_schedule(
                self.lengths, self.num_replicas, self.max_token_len, force_group_size=self.force_group_size,
                num_batches_divided_by=self.gradient_accumulation_steps, cost_model=self.cost_model,
                use_dynamic_bsz_balance=False, max_samples_per_micro_batch=self.max_samples_per_micro_batch,
                workload_fn=self.workload_fn,
            )
        except ValueError as error:
            if "Cannot satisfy" not in str(error):
                raise
            raise self._cannot_satisfy(self._unit) from error
        g = self.force_group_size
        self.count = schedule.num_micro_batches * self.num_replicas
        self._tight_bins = np.empty(len(self._items), dtype=np.int64)
        grid = np.empty((self.num_replicas, schedule.num_micro_batches), dtype=np.int64)
        for r, rank_slots in enumerate(schedule.micro_batches):
            for s, samples in enumerate(rank_slots):
                b = s * self.num_replicas + r
                self._tight_bins[np.asarray(samples[::g]) // g] = b
                grid[r, s] = b
        self._tight_grid = grid  # the schedule's own slots (its slot evening), kept

    def _grow_tight(self, count: int) -> None:
        from ..partition.packing import split_bins_to_count

        bins = _groups_from_assignment(self._tight_bins, self.count)
        grown = split_bins_to_count(bins, self._items.additive, count)
        self._tight_bins = _assignment_from_groups(grown, len(self._items))

    def _rng(self, epoch: int, stream: int) -> np.random.Generator:
        """The random stream ``stream`` of ``epoch``: the same on every rank and machine."""
        return np.random.default_rng([self.seed & ((1 << 63) - 1), epoch, stream])

    def _draw(self, count: int, epoch: int, attempt: int) -> Optional[np.ndarray]:
        rng = self._rng(epoch, attempt)
        kind, noise = DRAWS[attempt]
        items = self._items
        if kind == "deal":
            bins = fresh_mix_bins(items.additive, count, items.capacity, rng, max_items=self._max_items)
            rounds = swap_rounds(len(items), within_work=True)  # none past 10^6 items: random enough there
            if bins is None or not rounds:
                return bins
            return swap_mix(bins, items.additive, items.capacity, rng, rounds=rounds,
                            band=int(DEAL_SWAP_BAND * items.capacity))
        if kind == "swaps":
            if count != self.count:
                return None
            return swap_mix(self._tight_bins, items.additive, items.capacity, rng)
        bins = noisy_best_fit_bins(items.additive, count, items.capacity, rng, noise=noise, max_items=self._max_items)
        return None if bins is None else swap_mix(bins, items.additive, items.capacity, rng)

    def __len__(self) -> int:
        """Micro-batches per rank per epoch (the same on every rank and in every epoch). O(1)."""
        return self.count // self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan :meth:`__iter__` yields: an int >= 0 (else a
        ``ValueError`` naming ``set_epoch``). O(1)."""
        self.epoch = _epoch_argument(epoch, "set_epoch")

    # --- an epoch's plan -----------------------------------------------------------------------

    def _epoch_bins(self, epoch: int) -> tuple[np.ndarray, Optional[str]]:
        """Every item's bin for ``epoch``, and the draw that made it (None: the tight plan)."""
        if self.mix == "fresh":
            epoch = epoch if self.shuffle else 0
            if epoch == 0:
                return self._epoch0, DRAWS[self._first_draw][0]
            first = self._first_draw
            for attempt in [first] + [a for a in range(len(DRAWS)) if a != first]:
                bins = self._draw(self.count, epoch, attempt)
                if bins is not None:
                    return bins, DRAWS[attempt][0]
        return self._tight_bins, None

    def epoch_source(self, epoch: int) -> str:
        """How ``epoch`` is planned: ``"deal"``, ``"best fit"`` or ``"swaps"`` (a fresh random
        partition, see :data:`DRAWS`), or ``"tight"`` (the tight plan, relabelled: the padded
        cost). O(n log K) to O(n log n) (the draws tried)."""
        return self._epoch_bins(_epoch_argument(epoch, "epoch_source"))[1] or "tight"

    def _relabel(self, bins: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``bins`` with the forced groups of equal cost traded at random (equal rounded tokens
        for the token cost, equal rounded longest sample for the padded cost): every bin keeps
        its cost and its sample count, the samples change. O(n log n)."""
        labels = self._items.trade_key
        order = np.lexsort((rng.random(len(labels)), labels))  # each class in random order
        by_class = np.lexsort((np.arange(len(labels)), labels))  # each class in index order
        relabelled = np.empty_like(bins)
        relabelled[order] = bins[by_class]
        return relabelled

    def _grid(self, bins: np.ndarray, rng: Optional[np.random.Generator], fresh: bool) -> np.ndarray:
        if not fresh and self._tight_grid is not None:
            grid = self._tight_grid
            if rng is not None:
                grid = grid[:, rng.permutation(grid.shape[1])]
            return grid
        workloads = np.bincount(bins, weights=self._items.workloads, minlength=self.count)
        return deal_slots(workloads, self.num_replicas, rng)

    def _rank_plan(self, epoch: int, ranks: Sequence[int]) -> list[list[list[int]]]:
        bins, kind = self._epoch_bins(epoch)
        fresh = kind is not None
        rng = self._rng(epoch, len(DRAWS)) if self.shuffle else None
        if not fresh and rng is not None:
            bins = self._relabel(bins, rng)
        grid = self._grid(bins, rng, fresh)
        if self.micro_batch_order is not None:
            grid = self._ordered_steps(bins, grid)
        return _bins_to_samples(bins, [grid[r] for r in ranks], self.force_group_size)

    def _ordered_steps(self, bins: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """``grid`` (``[rank][slot]`` of bin ids) with the slots of every optimizer step (each
        run of ``gradient_accumulation_steps``) in ``micro_batch_order``: by slot workload for
        ``"pipeline"``, by the slot's largest bin (its cost against the cap) for
        ``"largest_first"``. O(K log K)."""
        from ..schedule.dp_schedule import _slot_order

        items, g = self._items, self.force_group_size
        work = np.bincount(bins, weights=items.workloads, minlength=self.count)
        if items.additive is not None:
            size = np.bincount(bins, weights=items.additive, minlength=self.count)
        else:  # padded: samples x the longest (rounded) sample of the bin
            longest = np.zeros(self.count, dtype=np.int64)
            np.maximum.at(longest, bins, items.trade_key)
            size = np.bincount(bins, minlength=self.count) * g * longest
        ordered = grid.copy()
        step = self.gradient_accumulation_steps
        for start in range(0, grid.shape[1], step):
            window = grid[:, start:start + step]
            order = _slot_order(window.T.tolist(), work, self.micro_batch_order, size)
            ordered[:, start:start + step] = window[:, order]
        return ordered

    def epoch_plan(self, epoch: Optional[int] = None) -> list[list[list[int]]]:
        """Every rank's micro-batches for ``epoch`` (default the current one): ``[rank][slot]``,
        ascending global indices. The same on every rank. O(n log n)."""
        epoch = self.epoch if epoch is None else _epoch_argument(epoch, "epoch_plan")
        return self._rank_plan(epoch, range(self.num_replicas))

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches for the current epoch, in step order."""
        return iter(self._rank_plan(self.epoch, [self.rank])[0])


def pack_rows(
    lengths: Sequence[int],
    seq_length: int,
    *,
    num_replicas: int = 1,
    cost_model: Union[None, str, Any] = None,
    process_group: Any = None,
    workload_fn: Optional[WorkloadFn] = None,
) -> list[list[list[int]]]:
    """Pack a dataset's samples into rows of at most ``seq_length`` tokens, offline (the job of
    TRL's ``pack_dataset(strategy="bfd")``), with the rows balanced over ``num_replicas`` ranks.

    Unlike TRL's ``"bfd"`` (which truncates a sample longer than ``seq_length`` and drops the
    overflow tokens) and ``"bfd_split"`` (which splits it across rows), no sample is ever cut:
    one longer than ``seq_length`` is a ``ValueError`` naming it. Unlike TRL's, which packs each
    ``datasets.map`` batch (1000 samples by default) separately, the whole list is packed at
    once, so rows are never fewer than TRL's would be for want of partners.

    Where torch.distributed is initialised and ``process_group`` (default: the default group)
    has more than one rank, call it on every rank of that group, whatever ``num_replicas`` says:
    the ranks check in one all-reduce that they pass the same lengths and arguments and that
    ``num_replicas`` is the group's size or, on every rank alike, 1 (rows packed once for the
    whole group, to be shared out afterwards, e.g. by a ``DistributedSampler`` over the rows),
    and all raise the same ``ValueError`` if not.

    ``workload_fn`` (lengths -> non-negative workloads, as in :func:`seqbal.plan_micro_batches`)
    is what the rows of one index balance across ranks; default None: their tokens. Every rank
    must pass the same model (it is part of what the ranks compare).

    Returns:
        ``[rank][row]``: ascending sample indices per row; every rank has the same number of
        rows (best-fit decreasing's count, rounded up to a multiple of ``num_replicas``), rows of
        one index ``i`` carry similar tokens (similar workloads, with ``workload_fn``) on every
        rank, every sample appears exactly once.

    Complexity: one best-fit-decreasing pass, O(n log n).

    Examples:
        >>> pack_rows([4, 3, 1, 2, 1], 4)
        [[[0], [1, 2], [3, 4]]]
    """
    error: Optional[BaseException] = None
    array = None
    workloads = None
    settings: dict[str, Optional[int]] = dict.fromkeys(("seq_length", "num_replicas", "cost_model", "workload_fn"))
    try:
        seq_length = int_argument("seq_length", seq_length)
        settings["seq_length"] = seq_length
        num_replicas = int_argument("num_replicas", num_replicas)
        settings["num_replicas"] = num_replicas
        cost = as_cost_model(cost_model)
        settings["cost_model"] = digest(repr(cost))
        array = int_array(lengths, "lengths", samples=True, integral_floats=False,
                          empty="lengths is empty: the dataset has no sample to pack")
        settings["workload_fn"], workloads = _workload_setting(workload_fn, array)
    except ValueError as caught:
        error = caught
    # num_replicas=1 on every rank is packing once for the group (compared like every setting);
    # any other count must be the group's size.
    agree_or_raise(list(settings.items()), array, error, process_group, who="pack_rows",
                   num_replicas=None if settings["num_replicas"] == 1 else settings["num_replicas"])
    items = _Items(array, seq_length, "seq_length", cost, 1)
    if items.additive is None:  # the padded cost: its own exact partitioner, through the schedule
        from ..schedule import build_dp_schedule

        schedule = build_dp_schedule(array, num_replicas, seq_length, cost_model=cost, use_dynamic_bsz_balance=False,
                                     workload_fn=workload_fn)
        return [[list(part) for part in rank_parts] for rank_parts in schedule.micro_batches]
    from ..partition import best_fit_decreasing_partitions
    from ..partition.packing import split_bins_to_count

    rows = best_fit_decreasing_partitions(items.additive, items.capacity)
    count = -(-len(rows) // num_replicas) * num_replicas
    if count > len(array):
        raise ValueError(
            f"pack_rows: {num_replicas} ranks need at least {count} rows, one sample each at least, but there are "
            f"only {len(array)} samples: use fewer num_replicas"
        )
    if count > len(rows):
        rows = split_bins_to_count(rows, items.additive, count)
    bins = _assignment_from_groups(rows, len(array))
    weights = items.additive if workloads is None else workloads.astype(np.float64)
    grid = deal_slots(np.bincount(bins, weights=weights, minlength=count), num_replicas, None)
    return _bins_to_samples(bins, list(grid), 1)
