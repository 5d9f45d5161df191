"""Rank side of tests/test_loss.py: gradient accumulation with loss_weights on 2 and 3 gloo ranks.

Every rank builds its own batch (deterministic from its rank, so the parent rebuilds every
batch for the full-batch reference), micro-batches it with ``dummy_micro_batches=True``,
back-propagates ``(token_loss * mask * w[:, None]).sum()`` per micro-batch and reduces the
gradients over the group as DDP does (mean) or by sum. The pair scenarios plan preference
pairs (samples ``2i``, ``2i+1``) with ``force_group_size=2`` and back-propagate a DPO-like
pairwise loss weighted per pair. Nothing here asserts: a wrong rank must
still join the next collective; the parent asserts on the JSON records.
"""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from tensordict import TensorDict

import seqbal
from seqbal.loss import LOSS_MODES
from tests.process_group import close_process_group

FEATURES = 3
WIDTH = 9
CAP = 12
#: rank 0 holds many samples, rank 1 few: at CAP rank 1 is short and gets dummies (rank 2, of
#: the 3-rank world, is in between)
SAMPLES = (10, 2, 7)
#: Preference pairs per rank (two samples each), for the pairwise scenarios.
PAIRS = (5, 1, 3)
#: The cap of the pair scenarios: a pair (two samples of up to WIDTH tokens) always fits.
PAIR_CAP = 2 * WIDTH + 2
#: The pairwise loss's temperature (DPO's beta).
BETA = 0.7
MODES = LOSS_MODES


def rank_batch(rank: int, nested: bool = False) -> TensorDict:
    """Right-padded samples with per-token features; sample 0 of rank 0 has no loss token."""
    generator = torch.Generator().manual_seed(50 + rank)
    n = SAMPLES[rank]
    lengths = torch.randint(1, WIDTH + 1, (n,), generator=generator)
    mask = (torch.arange(WIDTH)[None] < lengths[:, None]).long()
    loss_mask = mask * (torch.rand(n, WIDTH, generator=generator) < 0.7).long()
    if rank == 0:
        loss_mask[0] = 0
    features = torch.randn(n, WIDTH, FEATURES, generator=generator, dtype=torch.float64)
    entries = {"attention_mask": mask, "loss_mask": loss_mask, "features": features}
    if nested:
        entries["loss_mask"] = torch.nested.as_nested_tensor(
            [row[:length] for row, length in zip(loss_mask, lengths.tolist())], layout=torch.jagged
        )
    return TensorDict(entries, batch_size=[n])


def pair_batch(rank: int) -> TensorDict:
    """``PAIRS[rank]`` preference pairs (samples ``2i`` chosen, ``2i + 1`` rejected), right-padded,
    every sample with at least one loss token."""
    generator = torch.Generator().manual_seed(80 + rank)
    n = 2 * PAIRS[rank]
    lengths = torch.randint(1, WIDTH + 1, (n,), generator=generator)
    mask = (torch.arange(WIDTH)[None] < lengths[:, None]).long()
    loss_mask = mask * (torch.rand(n, WIDTH, generator=generator) < 0.7).long()
    loss_mask[:, 0] = 1
    features = torch.randn(n, WIDTH, FEATURES, generator=generator, dtype=torch.float64)
    return TensorDict({"attention_mask": mask, "loss_mask": loss_mask, "features": features}, batch_size=[n])


def pair_losses(theta: torch.Tensor, batch: TensorDict) -> torch.Tensor:
    """The DPO-like loss of each pair of ``batch`` (rows ``2i``, ``2i + 1``), ``[pairs]``:
    ``-log sigmoid(beta * (score_chosen - score_rejected))``, a sample's score being the sum of
    its masked token log-likelihoods (``-token_loss``). Not linear in the members' scores: the
    pair is only scored whole."""
    scores = -(token_loss(theta, batch["features"]) * batch["loss_mask"].to(theta.dtype)).sum(-1)
    return -torch.nn.functional.logsigmoid(BETA * (scores[0::2] - scores[1::2]))


def parameters() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, FEATURES, dtype=torch.float64)


def token_loss(theta: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """A non-linear per-token loss of the parameters, ``[b, T]``."""
    return torch.log1p(torch.exp(features @ theta)) + 0.1 * (features @ theta) ** 2


def dense_mask(micro_batch: TensorDict) -> torch.Tensor:
    mask = micro_batch["loss_mask"]
    if mask.is_nested:
        return torch.stack([torch.nn.functional.pad(row, (0, WIDTH - len(row))) for row in mask.unbind()])
    return mask


#: The precisions of the exactness scenarios: "float64" passes ``dtype=torch.float64``,
#: "float64-mask" a float64 mask and no dtype (the default follows the mask), "float32" runs
#: the whole step (parameters, features, weights) in float32.
PRECISIONS = ("float64", "float64-mask", "float32")


def accumulate(rank: int, mode: str, reduction: str, nested: bool, group, precision: str = "") -> dict:
    batch = rank_batch(rank, nested)
    options = {}
    if precision == "float64":
        options["dtype"] = torch.float64
    elif precision == "float64-mask":
        batch["loss_mask"] = batch["loss_mask"].to(torch.float64)
    elif precision == "float32":
        batch["features"] = batch["features"].to(torch.float32)
        options["dtype"] = torch.float32
    micro_batches, indices = seqbal.rearrange_micro_batches(batch, CAP, dp_group=group, dummy_micro_batches=True)
    weights = seqbal.loss_weights(
        micro_batches, indices, loss_mask_key="loss_mask", mode=mode, dp_group=group, grad_reduction=reduction,
        **options,
    )
    theta = parameters().to(batch["features"].dtype).requires_grad_(True)
    for micro_batch, weight in zip(micro_batches, weights):
        mask = dense_mask(micro_batch).to(theta.dtype)
        loss = (token_loss(theta, micro_batch["features"]) * mask * weight[:, None]).sum()
        loss.backward()
    gradient = theta.grad.clone()
    dist.all_reduce(gradient, group=group)  # SUM, then the engine's averaging for "mean"
    if reduction == "mean":
        gradient /= dist.get_world_size(group)
    return {
        "gradient": gradient.tolist(), "indices": indices, "weights": [w.tolist() for w in weights],
        "dtypes": sorted({str(w.dtype) for w in weights}),
    }


def accumulate_pairs(rank: int, reduction: str, group) -> dict:
    """One step of the pairwise loss: pairs kept whole by the plan, one weight per pair (its
    members' weight under ``seq-mean-token-sum`` with ``force_group_size=2``)."""
    batch = pair_batch(rank)
    micro_batches, indices = seqbal.rearrange_micro_batches(
        batch, PAIR_CAP, dp_group=group, dummy_micro_batches=True, force_group_size=2
    )
    weights = seqbal.loss_weights(
        micro_batches, indices, loss_mask_key="loss_mask", mode="seq-mean-token-sum", dp_group=group,
        grad_reduction=reduction, dtype=torch.float64, force_group_size=2,
    )
    theta = parameters().requires_grad_(True)
    for micro_batch, weight in zip(micro_batches, weights):
        (pair_losses(theta, micro_batch) * weight[0::2]).sum().backward()
    gradient = theta.grad.clone()
    dist.all_reduce(gradient, group=group)
    if reduction == "mean":
        gradient /= dist.get_world_size(group)
    return {"gradient": gradient.tolist(), "indices": indices, "weights": [w.tolist() for w in weights]}


def error_record(call) -> dict:
    """``call()``'s ValueError as ``{"error": message, "code": code}`` (``{"error": None}`` if none)."""
    try:
        call()
        return {"error": None}
    except ValueError as error:
        return {"error": str(error), "code": getattr(error, "code", None)}


def init_gloo(rank: int, world: int, init_file: str) -> None:
    """The default gloo group over ``world`` processes, with a 30 s collective timeout."""
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )


def error_scenario(rank: int, kind: str, group) -> dict:
    batch = rank_batch(rank)
    pairs = kind == "groups_on_one_rank"  # both ranks plan pairs; rank 0 alone passes them to loss_weights
    micro_batches, indices = seqbal.rearrange_micro_batches(
        batch, PAIR_CAP if pairs else CAP, dp_group=group, dummy_micro_batches=True, force_group_size=2 if pairs else 1)
    key, mode, options = "loss_mask", "token-mean", {}
    if kind == "mismatched_scale":
        mode, options = "seq-mean-token-sum-norm", {"loss_scale_factor": 16 if rank == 1 else 9}
    if kind == "groups_on_one_rank" and rank == 0:
        mode, options = "seq-mean-token-sum", {"force_group_size": 2}
    elif kind == "groups_on_one_rank":
        mode = "seq-mean-token-sum"
    if kind == "missing_key" and rank == 1:
        key = "no_such_mask"
    if kind == "mismatched_mode" and rank == 1:
        mode = "seq-mean-token-sum"
    if kind == "half_mask" and rank == 1:
        micro_batches[0]["loss_mask"] = micro_batches[0]["loss_mask"] * 0.5
    if kind == "three_d_mask" and rank == 1:  # [b, T, 2]: each token twice, if it were accepted
        mask = micro_batches[0]["loss_mask"]
        micro_batches[0] = TensorDict({"loss_mask": mask[..., None].expand(*mask.shape, 2)}, [mask.shape[0]])
    return error_record(
        lambda: seqbal.loss_weights(micro_batches, indices, loss_mask_key=key, mode=mode, dp_group=group, **options))


def write_records_and_exit(out_dir: str, rank: int, records: dict) -> None:
    """Write ``rank``'s records for the parent, then leave without the interpreter's teardown,
    where gloo's threads have aborted a finished rank ("terminate called without an active
    exception", exit -6)."""
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(records, handle)
    os._exit(0)


def worker_main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Every scenario on 2 ranks; on 3 ranks, every mode and reduction in float64 and the pairs."""
    records = {}
    try:
        init_gloo(rank, world, init_file)
        group = dist.group.WORLD
        for reduction in ("mean", "sum"):
            records[f"pairs/{reduction}"] = accumulate_pairs(rank, reduction, group)
        if world == 3:
            for mode in MODES:
                for reduction in ("mean", "sum"):
                    records[f"{mode}/{reduction}/float64"] = accumulate(rank, mode, reduction, False, group, "float64")
            close_process_group(exit_process=False)
            write_records_and_exit(out_dir, rank, records)
        for mode in MODES:
            for reduction in ("mean", "sum"):
                records[f"{mode}/{reduction}"] = accumulate(rank, mode, reduction, False, group)
            records[f"{mode}/nested"] = accumulate(rank, mode, "mean", True, group)
            for reduction in ("mean", "sum"):
                for precision in PRECISIONS:
                    records[f"{mode}/{reduction}/{precision}"] = accumulate(rank, mode, reduction, False, group, precision)
        for kind in ("missing_key", "mismatched_mode", "half_mask", "three_d_mask", "mismatched_scale", "groups_on_one_rank"):
            records[f"error/{kind}"] = error_scenario(rank, kind, group)
        lengths = rank_batch(rank)["attention_mask"].sum(-1).tolist()
        # rank 1 (the short one) asks for dummies, rank 0 does not: both must raise, none hang
        records["error/mismatched_dummies"] = error_record(
            lambda: seqbal.plan_micro_batches(lengths, CAP, dp_group=group, dummy_micro_batches=rank == 1))
        close_process_group(exit_process=False)
    except Exception:  # noqa: BLE001 - recorded for the parent, which asserts
        records["__crash__"] = traceback.format_exc()
    write_records_and_exit(out_dir, rank, records)
