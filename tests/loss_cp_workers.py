"""Rank side of the context-parallel scenarios of tests/test_loss.py: 2 DP x 2 CP gloo ranks.

Global rank ``r`` is data-parallel replica ``r // 2`` and context-parallel rank ``r % 2`` in
it. The two CP ranks of a replica plan the replica's batch (``loss_workers.rank_batch``) over
their DP group, so they hold the same micro-batches; each then keeps its shard of every
sequence (token columns ``t % 2 == cp_rank``), back-propagates its shard's weighted token loss,
and the gradients are all-reduced over all four ranks (DP x CP), averaged for "mean" as FSDP
does over its ``dp_shard_cp`` mesh. Nothing here asserts; the parent asserts on the records.
"""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
from tensordict import TensorDict

import seqbal

from . import loss_workers as base
from .process_group import close_process_group

DP, CP = 2, 2


def shard(micro_batch: TensorDict, cp_rank: int) -> TensorDict:
    """This CP rank's token columns of a micro-batch (every row: the samples are shared)."""
    return TensorDict(
        {key: micro_batch[key][:, cp_rank::CP] for key in ("loss_mask", "features")}, batch_size=micro_batch.batch_size
    )


def step(rank: int, mode: str, reduction: str, groups: dict, with_cp: bool) -> dict:
    replica, cp_rank = divmod(rank, CP)
    batch = base.rank_batch(replica)
    micro_batches, indices = seqbal.rearrange_micro_batches(
        batch, base.CAP, dp_group=groups["dp"], dummy_micro_batches=True
    )
    shards = [shard(micro_batch, cp_rank) for micro_batch in micro_batches]
    weights = seqbal.loss_weights(
        shards, indices, loss_mask_key="loss_mask", mode=mode, dp_group=groups["dp"], grad_reduction=reduction,
        dtype=torch.float64, cp_group=groups["cp"] if with_cp else None,
    )
    theta = base.parameters().requires_grad_(True)
    for piece, weight in zip(shards, weights):
        (base.token_loss(theta, piece["features"]) * piece["loss_mask"] * weight[:, None]).sum().backward()
    gradient = theta.grad.clone()
    dist.all_reduce(gradient)  # over DP x CP (the whole world here), SUM
    if reduction == "mean":
        gradient /= DP * CP
    return {"gradient": gradient.tolist(), "indices": indices}


def pair_step(rank: int, reduction: str, groups: dict) -> dict:
    """The pairwise loss under context parallelism: each CP rank scores its shard of every
    sample, the full scores are summed over ``cp_group`` (gradient through this rank's shard
    only, so that the CP ranks' gradients add up to the whole sample's), and each pair's loss is
    weighted by its group's weight."""
    replica, cp_rank = divmod(rank, CP)
    micro_batches, indices = seqbal.rearrange_micro_batches(
        base.pair_batch(replica), base.PAIR_CAP, dp_group=groups["dp"], dummy_micro_batches=True, force_group_size=2
    )
    shards = [shard(micro_batch, cp_rank) for micro_batch in micro_batches]
    weights = seqbal.loss_weights(
        shards, indices, loss_mask_key="loss_mask", mode="seq-mean-token-sum", dp_group=groups["dp"],
        grad_reduction=reduction, dtype=torch.float64, cp_group=groups["cp"], force_group_size=2,
    )
    theta = base.parameters().requires_grad_(True)
    for piece, weight in zip(shards, weights):
        own = -(base.token_loss(theta, piece["features"]) * piece["loss_mask"]).sum(-1)
        whole = own.detach().clone()
        dist.all_reduce(whole, group=groups["cp"])
        scores = own + (whole - own.detach())
        losses = -torch.nn.functional.logsigmoid(base.BETA * (scores[0::2] - scores[1::2]))
        (losses * weight[0::2]).sum().backward()
    gradient = theta.grad.clone()
    dist.all_reduce(gradient)
    if reduction == "mean":
        gradient /= DP * CP
    return {"gradient": gradient.tolist(), "indices": indices}


def error_scenario(rank: int, kind: str, groups: dict) -> dict:
    replica, cp_rank = divmod(rank, CP)
    micro_batches, indices = seqbal.rearrange_micro_batches(
        base.rank_batch(replica), base.CAP, dp_group=groups["dp"], dummy_micro_batches=True
    )
    shards = [shard(micro_batch, cp_rank) for micro_batch in micro_batches]
    key = "loss_mask"
    if rank == 3 and kind == "missing_key":
        key = "no_such_mask"
    if rank == 3 and kind == "more_samples":  # one micro-batch more than its CP peer, validly numbered
        samples = sum(len(part) for part in indices)
        shards = shards + shards[:1]
        indices = indices + [list(range(samples, samples + len(shards[0])))]
    return base.error_record(
        lambda: seqbal.loss_weights(shards, indices, loss_mask_key=key, dp_group=groups["dp"], cp_group=groups["cp"]))


def worker_main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    records = {}
    try:
        base.init_gloo(rank, world, init_file)
        # every rank creates every group, in the same order
        dp_groups = [dist.new_group([c + CP * d for d in range(DP)]) for c in range(CP)]
        cp_groups = [dist.new_group([CP * d + c for c in range(CP)]) for d in range(DP)]
        groups = {"dp": dp_groups[rank % CP], "cp": cp_groups[rank // CP]}
        for mode in base.MODES:
            for reduction in ("mean", "sum"):
                records[f"{mode}/{reduction}"] = step(rank, mode, reduction, groups, with_cp=True)
                records[f"{mode}/{reduction}/dp-only"] = step(rank, mode, reduction, groups, with_cp=False)
        for reduction in ("mean", "sum"):
            records[f"pairs/{reduction}"] = pair_step(rank, reduction, groups)
        for kind in ("missing_key", "more_samples"):
            records[f"error/{kind}"] = error_scenario(rank, kind, groups)
        close_process_group(exit_process=False)
    except Exception:  # noqa: BLE001 - recorded for the parent, which asserts
        records["__crash__"] = traceback.format_exc()
    base.write_records_and_exit(out_dir, rank, records)
