"""A token-budget batch sampler for a map-style dataset, and offline packing into rows: pure
planning on the dataset's global lengths, no trainer, no collective.

Why the epoch is planned once, as a whole: transformers' ``Trainer`` reads ``len()`` of the
training dataloader once, before the first epoch, and then takes exactly that many batches
(``gradient_accumulation_steps`` per optimizer step) in every epoch. A plan that changes its
count with the shuffle would leave a rank short of a batch (a hang in the gradient all-reduce)
or skip data. So the sampler plans the whole dataset once with :func:`seqbal.build_dp_schedule`
(every micro-batch under the cap, the same count on every rank, slot ``i`` balanced across
ranks), and each epoch reshuffles it in the two ways that keep every cost exactly: the order of
the slots (the same permutation on every rank, so slots stay aligned), and which sample fills a
place among the samples (or forced groups) of equal lengths. The trade-off: which *lengths* share
a micro-batch is fixed for the run; which samples, and in what step order, changes every epoch.
On real length lists (thousands of samples over a few thousand distinct lengths) most samples
have several equal-length peers.

Every rank computes the same plan from the same global lengths, so nothing is exchanged, and an
impossible cap is the same ``ValueError`` on every rank, raised when the sampler is built.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

__all__ = ["TokenBudgetBatchSampler", "pack_rows"]


def _default_replicas(num_replicas: Optional[int], rank: Optional[int]) -> tuple[int, int]:
    """torch's ``DistributedSampler`` defaults: the default process group's size and rank, or one
    process without an initialised torch.distributed."""
    if num_replicas is None or rank is None:
        initialised = False
        try:
            import torch.distributed as dist

            initialised = dist.is_available() and dist.is_initialized()
        except ImportError:  # pragma: no cover - torch ships torch.distributed
            pass
        if num_replicas is None:
            num_replicas = dist.get_world_size() if initialised else 1
        if rank is None:
            rank = dist.get_rank() if initialised else 0
    if not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive int, got {num_replicas!r}")
    if not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}")
    return int(num_replicas), int(rank)


def _as_lengths(lengths: Any) -> np.ndarray:
    array = np.asarray(lengths.tolist() if hasattr(lengths, "tolist") else list(lengths), dtype=np.int64).reshape(-1)
    if array.size == 0:
        raise ValueError("lengths is empty: the dataset has no sample to plan")
    return array


class TokenBudgetBatchSampler:
    """Index lists for ``DataLoader(dataset, batch_sampler=...)``: micro-batches under a token cap,
    the same number on every rank, balanced slot by slot, reshuffled every epoch.

    Guarantees (for the chosen cost model, on every rank, every epoch):

    - every micro-batch costs at most ``max_token_len`` (and holds at most
      ``max_samples_per_micro_batch`` samples, where given); an impossible cap is a ``ValueError``
      naming the sample, its tokens and the cap, raised here, when the sampler is built;
    - ``len(self)`` is the exact number of micro-batches each rank yields per epoch, the same on
      every rank and in every epoch, computed from the global lengths with no collective; it is
      a multiple of ``gradient_accumulation_steps``, so every optimizer step has that many
      micro-batches per rank and a variable number of samples;
    - every sample appears exactly once per epoch over all ranks; samples ``i*g .. i*g+g-1``
      (``g = force_group_size``) share a micro-batch;
    - rank ``r``'s ``i``-th micro-batch is slot ``i`` of the schedule on every rank (balanced
      work, see :func:`seqbal.build_dp_schedule`);
    - :meth:`set_epoch` reshuffles deterministically by ``seed`` and epoch; iterating again gives
      the same batches, so skipping the first ``k`` (transformers does on resume) leaves exactly
      the remaining ones.

    Args:
        lengths: the tokens of every sample of the dataset (all ranks' samples, the same list on
            every rank).
        max_token_len: hard cap on a micro-batch's cost.
        num_replicas: data-parallel ranks; default the default process group's size (1 without
            torch.distributed).
        rank: this rank; default the process group's rank (0).
        seed: shuffle seed (combined with the epoch).
        shuffle: False keeps the schedule's slot order (heaviest first) and its samples.
        cost_model: :class:`seqbal.CostModel` or its name (``"padded"`` when the collator pads);
            default the token cost (padding-free collation).
        force_group_size: consecutive samples that must share a micro-batch.
        gradient_accumulation_steps: the count per rank is made a multiple of this.
        max_samples_per_micro_batch: a second hard cap, on the samples of every micro-batch
            (see :func:`seqbal.build_dp_schedule`); default None (as many as fit the tokens).
            The epoch's reshuffle keeps every micro-batch's sample count.

    Complexity: the plan is one :func:`seqbal.build_dp_schedule` on ``n`` lengths, at
    construction; an epoch's shuffle is O(n log n); memory O(n).

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
    ) -> None:
        from .. import build_dp_schedule

        self.num_replicas, self.rank = _default_replicas(num_replicas, rank)
        if not isinstance(gradient_accumulation_steps, (int, np.integer)) or gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be a positive int, got {gradient_accumulation_steps!r}")
        self.lengths = _as_lengths(lengths)
        self.max_token_len = max_token_len
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.force_group_size = force_group_size
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        self.epoch = 0
        self.schedule = build_dp_schedule(
            self.lengths.tolist(),
            self.num_replicas,
            max_token_len,
            force_group_size=force_group_size,
            num_batches_divided_by=self.gradient_accumulation_steps,
            cost_model=cost_model,
            use_dynamic_bsz_balance=False,
            max_samples_per_micro_batch=max_samples_per_micro_batch,
        )
        self._group_classes = self._equal_length_classes()

    def _equal_length_classes(self) -> list[np.ndarray]:
        """The forced groups, grouped by their tuple of lengths: any two of one class may trade
        places without changing any cost."""
        g = self.force_group_size
        rows = self.lengths.reshape(-1, g)
        _, labels = np.unique(rows, axis=0, return_inverse=True)
        labels = labels.reshape(-1)
        order = np.argsort(labels, kind="stable")
        cuts = np.flatnonzero(np.diff(labels[order])) + 1
        return [part for part in np.split(order, cuts) if part.size > 1]

    def __len__(self) -> int:
        """Micro-batches per rank per epoch (the same on every rank and in every epoch). O(1)."""
        return self.schedule.num_micro_batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle :meth:`__iter__` yields. O(1)."""
        self.epoch = int(epoch)

    def _relabel(self, rng: np.random.Generator) -> np.ndarray:
        """A permutation of the sample indices that maps every forced group to one of equal
        lengths (a random one), members in place."""
        g = self.force_group_size
        group_map = np.arange(self.lengths.size // g)
        for members in self._group_classes:
            group_map[members] = members[rng.permutation(members.size)]
        return (group_map[:, None] * g + np.arange(g)[None, :]).reshape(-1)

    def epoch_plan(self, epoch: Optional[int] = None) -> list[list[list[int]]]:
        """Every rank's micro-batches for ``epoch`` (default the current one): ``[rank][slot]``,
        ascending global indices. The same on every rank. O(n log n)."""
        epoch = self.epoch if epoch is None else int(epoch)
        slots = range(self.schedule.num_micro_batches)
        relabel = np.arange(self.lengths.size)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            slots = rng.permutation(self.schedule.num_micro_batches).tolist()
            relabel = self._relabel(rng)
        return [
            [sorted(relabel[list(rank_slots[s])].tolist()) for s in slots]
            for rank_slots in self.schedule.micro_batches
        ]

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches for the current epoch, in step order."""
        return iter(self.epoch_plan()[self.rank])


def pack_rows(
    lengths: Sequence[int],
    seq_length: int,
    *,
    num_replicas: int = 1,
    cost_model: Union[None, str, Any] = None,
) -> list[list[list[int]]]:
    """Pack a dataset's samples into rows of at most ``seq_length`` tokens, offline (the job of
    TRL's ``pack_dataset(strategy="bfd")``), with the rows balanced over ``num_replicas`` ranks.

    Unlike TRL's ``"bfd"`` (which truncates a sample longer than ``seq_length`` and drops the
    overflow tokens) and ``"bfd_split"`` (which splits it across rows), no sample is ever cut:
    one longer than ``seq_length`` is a ``ValueError`` naming it. Unlike TRL's, which packs each
    ``datasets.map`` batch (1000 samples by default) separately, the whole list is packed at
    once, so rows are never fewer than TRL's would be for want of partners.

    Returns:
        ``[rank][row]``: ascending sample indices per row; every rank has the same number of
        rows, rows of one index ``i`` carry similar tokens on
        every rank, every sample appears exactly once.

    Complexity: one :func:`seqbal.build_dp_schedule` on ``n`` lengths.

    Examples:
        >>> pack_rows([4, 3, 1, 2, 1], 4)
        [[[0], [2, 3, 4], [1]]]
    """
    from .. import build_dp_schedule

    schedule = build_dp_schedule(
        _as_lengths(lengths).tolist(), num_replicas, seq_length, cost_model=cost_model, use_dynamic_bsz_balance=False
    )
    return [[list(part) for part in rank_parts] for rank_parts in schedule.micro_batches]
