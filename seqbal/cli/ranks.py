"""Simulating data-parallel ranks: the read lengths split over ranks the way the trainer would,
and each rank's figures (:func:`_rank_rows`, against :func:`packing_bound`).

``--route`` picks the split: verl's driver-side ``balance_batch`` (the default), contiguous
chunks, or seqbal's global ``build_dp_schedule``. The simulation of the ranks' decision is the
public :func:`~seqbal.plan_data_parallel`: the library's own agreement protocol with the
all-reduces replaced by a max/min over the simulated ranks. The lengths themselves are read
(and their errors named by file and line) in :mod:`.lengths`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .lengths import InputError, Lengths
from ..cost import CostModel, padded_min_count
from ..metrics import micro_batch_summary
from ..partition import ceildiv, packing_lower_bound
from ..plan import plan_data_parallel


ROUTES = ("balance_batch", "contiguous", "schedule")
@dataclass
class RankSplit:
    """Per simulated rank: its lengths, the input positions they came from, and (for the
    ``schedule`` route, which decides micro-batches too) its micro-batches."""

    lengths: list[np.ndarray]
    indices: list[np.ndarray]
    plans: Optional[list[list[list[int]]]] = None


def _shuffled_groups(n: int, group_size: int, seed: Optional[int]) -> np.ndarray:
    """Input positions in sampler order: whole groups, shuffled with ``seed`` when given."""
    order = np.arange(n // group_size)
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(order))
    return (order[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)


def split_over_ranks(
    lengths: np.ndarray,
    dp: int,
    group_size: int = 1,
    seed: Optional[int] = None,
    route: str = "contiguous",
    *,
    max_token_len: Optional[int] = None,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    cost_model: Optional[CostModel] = None,
    max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[Any] = None,
    micro_batch_order: str = "pipeline",
) -> RankSplit:
    """Deal ``lengths`` out to ``dp`` ranks in whole forced groups, the way a trainer would.

    Groups are first put in sampler order (shuffled with ``seed``), then:

    * ``contiguous``: ``dp`` consecutive chunks (sizes differ by at most one group), as a
      dataloader does without balancing;
    * ``balance_batch``: :func:`seqbal.balance_batch`, verl's driver-side balance (KK on workloads,
      equal group counts when ``dp`` divides them);
    * ``schedule``: :func:`seqbal.build_dp_schedule`, which also decides the micro-batches
      (``max_token_len`` and the count constraints are needed then).

    ``workload_fn`` (default: seqbal's formula) is what ``balance_batch`` and the schedule balance;
    ``micro_batch_order`` orders the schedule's slots (:mod:`seqbal.order`).

    Raises:
        InputError: ``group_size`` does not divide the number of samples, or fewer groups than ranks.
    """
    n = len(lengths)
    if n % group_size:
        raise InputError(f"--group-size {group_size} does not divide the number of samples {n}")
    groups = n // group_size
    if groups < dp:
        raise InputError(f"cannot split {groups} group(s) of {group_size} sample(s) over --dp {dp} ranks: every rank "
                         f"needs at least one group, so --dp can be at most {groups} here")
    order = _shuffled_groups(n, group_size, seed)
    ordered = lengths[order]
    if route == "contiguous":
        chunks = np.array_split(np.arange(groups), dp)
        positions = [(c[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1) for c in chunks]
        return RankSplit([ordered[p] for p in positions], [order[p] for p in positions])
    if route == "balance_batch":
        from ..schedule import balance_batch

        group_ids = None if group_size == 1 else (np.arange(n) // group_size).tolist()
        parts, _ = balance_batch(ordered, dp, equal_size=groups % dp == 0, group_ids=group_ids, workload_fn=workload_fn)
        positions = [np.asarray(p, dtype=np.int64) for p in parts]
        return RankSplit([ordered[p] for p in positions], [order[p] for p in positions])
    if route == "schedule":
        from ..schedule import build_dp_schedule

        if max_token_len is None:
            raise ValueError("the schedule route needs max_token_len")
        schedule = build_dp_schedule(
            ordered, dp, max_token_len, force_group_size=group_size,
            num_batches_divided_by=num_batches_divided_by, min_num_micro_batch=min_num_micro_batch,
            cost_model=cost_model, max_samples_per_micro_batch=max_samples_per_micro_batch, workload_fn=workload_fn,
            micro_batch_order=micro_batch_order,
        )
        positions = [np.asarray(r, dtype=np.int64) for r in schedule.rank_indices]
        return RankSplit(
            [ordered[p] for p in positions], [order[p] for p in positions],
            [schedule.local_micro_batches(r) for r in range(dp)],
        )
    raise ValueError(f"unknown route {route!r}; expected one of {ROUTES}")


def simulate_ranks(
    rank_lengths: Sequence[np.ndarray],
    max_token_len: int,
    *,
    force_group_size: int = 1,
    num_batches_divided_by: Optional[int] = None,
    min_num_micro_batch: Optional[int] = None,
    cost_model: Optional[CostModel] = None,
    max_samples_per_micro_batch: Optional[int] = None,
    workload_fn: Optional[Callable[[Any], Any]] = None,
    micro_batch_order: Optional[str] = None,
) -> list[list[list[int]]]:
    """What synced ranks decide: :func:`~seqbal.plan_data_parallel`, the library's own protocol
    with the all-reduces replaced by a max/min over the simulated ranks. Each rank's
    micro-batches come in ``micro_batch_order`` (``"pipeline"`` or ``"largest_first"``, the order
    a trainer runs them), or in the partitioner's order with None (default).

    Raises:
        MicroBatchPlanError: the library's own error, prefixed with the rank when ``dp > 1``.
    """
    return plan_data_parallel(
        list(rank_lengths),
        max_token_len,
        num_batches_divided_by=num_batches_divided_by,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=micro_batch_order is not None,
        force_group_size=force_group_size,
        cost_model=cost_model,
        max_samples_per_micro_batch=max_samples_per_micro_batch,
        workload_fn=workload_fn,
        micro_batch_order=micro_batch_order or "pipeline",
    )

def packing_bound(lengths: np.ndarray, cap: int, group_size: int = 1, cost_model: Optional[CostModel] = None) -> int:
    """Fewer micro-batches than this cannot hold ``lengths`` under ``cap``, on the chosen cost.

    Token cost: :func:`~seqbal.packing_lower_bound` of the forced groups' (rounded) tokens under
    the cap (lowered to a multiple of ``pack_round_to``). Padded cost:
    :func:`~seqbal.cost.padded_min_count`, the exact fewest for groups of equal size. Either is
    at least ``ceildiv(tokens, cap)``, the bound verl starts from, and often above it.

    Examples:
        >>> packing_bound(np.array([7] * 8), 8), ceildiv(56, 8)
        (8, 7)
        >>> packing_bound(np.array([3000] * 4 + [200] * 60), 4096, cost_model=CostModel(padded=True))
        7
    """
    cost_model = cost_model or CostModel()
    measured = cost_model.sample_costs(np.asarray(lengths, dtype=np.int64)).reshape(-1, group_size)
    if cost_model.padded:
        return padded_min_count(measured.max(axis=1), group_size, cap)
    return packing_lower_bound(measured.sum(axis=1), max(cost_model.token_capacity(cap), 1))


def _rank_rows(
    rank_lengths: Sequence[np.ndarray], plans: Sequence[list[list[int]]], cap: int,
    cost_model: Optional[CostModel] = None, group_size: int = 1, max_samples: Optional[int] = None,
) -> list[dict[str, Any]]:
    """One row per rank: its samples, tokens, bound, count and micro-batch figures. With
    ``max_samples`` (the sample cap) the packing bound is at least the sample bound,
    ``ceildiv(groups, max_samples // group_size)``."""
    cost_model = cost_model or CostModel()
    rows = []
    for rank, (lengths, parts) in enumerate(zip(rank_lengths, plans)):
        summary = micro_batch_summary(lengths, parts, cap)
        costs = cost_model.part_costs(lengths, parts)
        bound = packing_bound(lengths, cap, group_size, cost_model)
        if max_samples is not None and max_samples >= group_size:
            bound = max(bound, ceildiv(len(lengths) // group_size, max_samples // group_size))
        rows.append(
            {
                "rank": rank,
                "samples": int(len(lengths)),
                "tokens": int(lengths.sum()),
                "packing_bound": bound,
                "ceildiv_bound": ceildiv(int(lengths.sum()), cap),
                "micro_batches": int(summary["count"]),
                "fill": float(summary["fill"]),
                "workload_imbalance": float(summary["workload_imbalance"]),
                "largest_micro_batch": int(summary["max_tokens"]),
                "largest_cost": max(costs),
                "over_cap": sum(cost > cap for cost in costs),
                "most_samples": max((len(part) for part in parts), default=0),
                "micro_batch_tokens": [int(t) for t in summary["tokens"]],
            }
        )
    return rows


def _seqbal_on(split: RankSplit, args: argparse.Namespace) -> list[list[list[int]]]:
    if split.plans is not None:
        return split.plans
    return simulate_ranks(
        split.lengths, args.max_token_len, force_group_size=args.group_size,
        num_batches_divided_by=args.divisible_by, min_num_micro_batch=args.min_micro_batches,
        cost_model=args.cost_model, max_samples_per_micro_batch=args.max_samples_per_micro_batch,
        workload_fn=getattr(args, "workload_fn", None), micro_batch_order=getattr(args, "order", "pipeline"),
    )


def _split(lengths: Lengths, args: argparse.Namespace, route: str) -> RankSplit:
    return split_over_ranks(
        lengths.values, args.dp, args.group_size, args.seed, route, max_token_len=args.max_token_len,
        num_batches_divided_by=args.divisible_by, min_num_micro_batch=args.min_micro_batches,
        cost_model=args.cost_model, max_samples_per_micro_batch=args.max_samples_per_micro_batch,
        workload_fn=getattr(args, "workload_fn", None), micro_batch_order=getattr(args, "order", "pipeline"),
    )
