"""loss_weights: accumulated micro-batch gradients equal the full-batch gradient of the global loss.

Two references, on all ranks' samples at once, without micro-batches and without loss_weights:
the modes' definitions written here, and verl 0.9.1's own ``agg_loss`` over the whole global
batch (those tests skip where verl is not installed). The pairwise (DPO-like) loss's reference
is its mean over every pair of every rank. The distributed half runs 2 and 3 gloo ranks (one
of them short, so it gets dummy micro-batches) and 2 DP x 2 CP ranks under a hard deadline.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict

from seqbal import MicroBatchPlanError, loss_weights, rearrange_micro_batches

from . import loss_workers as workers
from .invariants import assert_plan_invariants

#: The losses are float64; the weights are float32 (relative error <= 2**-24 each), so the
#: accumulated gradient may differ from the full-batch one by about 1e-7 of its size.
RTOL = 1e-6
#: Float64 weights: the accumulated gradient equals the full-batch one to float64 rounding,
#: far inside 1e-9 of its size (float32 weights were off by about 1e-7).
RTOL_FLOAT64 = 1e-9


#: The hard deadline of each spawned world (a hang guard, not a timing): every mode, reduction and
#: precision runs in one world, well under a minute on an idle 2-core machine, and a machine loaded
#: many times over (a whole suite with -n auto beside other jobs) must still finish it.
DEADLINE_S = 600

#: The references of the exactness tests: the definitions below, and verl's ``agg_loss``.
REFERENCES = ("definition", "verl")
#: verl's ``seq-mean-token-mean`` divides each sequence's sum by ``n_s + 1e-8``: its gradient
#: sits up to ``1e-8 / n_s`` (relative) from the exact mean that loss_weights gives.
VERL_EPSILON = 1e-8


def verl_agg_loss():
    """verl 0.9.1's ``agg_loss`` (the test skips where verl is not installed)."""
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed").agg_loss


def reference_gradient(batch: TensorDict, mode: str, via: str = "definition", horizon=None) -> torch.Tensor:
    """Gradient of the global loss of ``mode`` over every sample of ``batch`` (one pass).

    ``via="verl"`` calls verl's ``agg_loss`` on the whole batch as verl's trainers do
    (``global_batch_size`` = the number of sequences, ``loss_scale_factor`` left to its
    default, the mask's width). ``horizon`` cuts the padded batch to that width (what a jagged
    batch padded as one would be)."""
    theta = workers.parameters().requires_grad_(True)
    losses = workers.token_loss(theta, batch["features"])
    mask = batch["loss_mask"].to(losses.dtype)
    if horizon is not None:
        losses, mask = losses[:, :horizon], mask[:, :horizon]
    per_sequence = (losses * mask).sum(-1)
    tokens = mask.sum(-1)
    if via == "verl":
        loss = verl_agg_loss()(losses, mask, mode, global_batch_size=len(mask))
    elif mode == "token-mean":
        loss = per_sequence.sum() / tokens.sum()
    elif mode == "token-sum":
        loss = per_sequence.sum()
    elif mode == "seq-mean-token-mean":  # a sequence without loss tokens adds 0 and still counts
        loss = torch.where(tokens > 0, per_sequence / tokens.clamp(min=1), torch.zeros_like(tokens)).sum() / len(tokens)
    elif mode == "seq-mean-token-sum":
        loss = per_sequence.sum() / len(tokens)
    else:  # seq-mean-token-sum-norm, the horizon being the mask's width
        loss = per_sequence.sum() / len(tokens) / mask.shape[-1]
    loss.backward()
    return theta.grad


def tolerance_for(base: float, mode: str, via: str) -> float:
    return base + (VERL_EPSILON if via == "verl" and mode == "seq-mean-token-mean" else 0.0)


def assert_close(gradient, reference: torch.Tensor, tolerance: float) -> float:
    """Max abs difference, asserted within ``tolerance`` of the reference's largest entry."""
    error = float((torch.as_tensor(gradient, dtype=torch.float64) - reference).abs().max())
    assert error <= tolerance * float(reference.abs().max()), (error, tolerance, reference)
    return error


def test_verl_agg_loss_is_the_one_these_tests_compare_with():
    """The verl reference is verl 0.9.1's five modes (a newer verl would need its own look)."""
    import importlib.metadata

    agg_loss = verl_agg_loss()
    assert importlib.metadata.version("verl") == "0.9.1"
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    for mode in workers.MODES:
        assert torch.isfinite(agg_loss(torch.ones(1, 3), mask, mode))
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):
        agg_loss(torch.ones(1, 3), mask, "seq-mean-token-max")


@pytest.mark.parametrize("via", REFERENCES)
@pytest.mark.parametrize("mode", workers.MODES)
def test_one_rank_accumulation_equals_the_full_batch_gradient(mode, via):
    batch = workers.rank_batch(0)
    micro_batches, indices = rearrange_micro_batches(batch, workers.CAP)
    assert len(micro_batches) >= 3
    for dtype, base in ((None, RTOL), (torch.float64, RTOL_FLOAT64)):
        weights = loss_weights(micro_batches, indices, loss_mask_key="loss_mask", mode=mode, dtype=dtype)
        theta = workers.parameters().requires_grad_(True)
        for micro_batch, weight in zip(micro_batches, weights):
            (workers.token_loss(theta, micro_batch["features"]) * micro_batch["loss_mask"] * weight[:, None]).sum().backward()
        assert_close(theta.grad, reference_gradient(batch, mode, via), tolerance_for(base, mode, via))


def test_the_common_mistake_would_be_caught():
    """A per-micro-batch token mean averaged over micro-batches differs from the reference: the
    comparison above can fail."""
    batch = workers.rank_batch(0)
    micro_batches, _ = rearrange_micro_batches(batch, workers.CAP)
    theta = workers.parameters().requires_grad_(True)
    for micro_batch in micro_batches:
        mask = micro_batch["loss_mask"]
        loss = (workers.token_loss(theta, micro_batch["features"]) * mask).sum() / mask.sum().clamp(min=1)
        (loss / len(micro_batches)).backward()
    assert float((theta.grad - reference_gradient(batch, "token-mean")).abs().max()) > 1e-3


def test_weights_follow_the_formulas_and_an_empty_sequence_counts():
    masks = [torch.tensor([[1, 1, 0], [0, 0, 0]]), torch.tensor([[1, 1, 1]])]
    micro_batches = [TensorDict({"response_mask": m}, [len(m)]) for m in masks]
    indices = [[0, 2], [1]]
    token = loss_weights(micro_batches, indices)
    assert torch.equal(torch.cat(token), torch.full((3,), 0.2))
    sequence = loss_weights(micro_batches, indices, mode="seq-mean-token-mean")
    assert torch.allclose(sequence[0], torch.tensor([1 / 6, 0.0])) and torch.allclose(sequence[1], torch.tensor([1 / 9]))
    summed = loss_weights(micro_batches, indices, mode="seq-mean-token-sum", grad_reduction="sum")
    assert torch.allclose(torch.cat(summed), torch.full((3,), 1 / 3))
    assert all(w.dtype == torch.float32 and w.dim() == 1 for w in token + sequence + summed)


def test_no_loss_token_at_all_gives_zero_weights():
    micro_batches = [TensorDict({"response_mask": torch.zeros(2, 4, dtype=torch.bool)}, [2])]
    assert loss_weights(micro_batches, [[0, 1]])[0].tolist() == [0.0, 0.0]


def test_nested_mask_and_dataproto_shaped_micro_batches():
    class Proto:  # what verl's DataProto looks like to loss_weights
        def __init__(self, batch):
            self.batch, self.non_tensor_batch, self.meta_info = batch, {}, {}

    rows = [torch.tensor([1, 1, 0, 1]), torch.tensor([1])]
    nested = TensorDict({"response_mask": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, [2])
    assert loss_weights([nested], [[0, 1]])[0].tolist() == [0.25, 0.25]
    assert loss_weights([Proto(nested)], [[0, 1]], mode="seq-mean-token-mean")[0].tolist() == pytest.approx([1 / 6, 1 / 2])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="token-max"), r"mode must be one of \['token-mean', 'token-sum', 'seq-mean-token-sum', "
                                 r"'seq-mean-token-sum-norm', 'seq-mean-token-mean'\]"),
        (dict(loss_scale_factor=0), r"loss_scale_factor must be None \(the response horizon\) or a finite number > 0, got 0"),
        (dict(loss_scale_factor=True), r"loss_scale_factor must be .*got True"),
        (dict(loss_scale_factor=float("inf")), r"loss_scale_factor must be .*got inf"),
        (dict(force_group_size=0), r"force_group_size must be a positive int, got 0"),
        (dict(force_group_size=2), r"force_group_size=2 does not divide this rank's 1 samples"),
        (dict(group_ids=[0, 1]), r"group_ids holds 2 ids but this rank's micro-batches hold 1 samples"),
        (dict(group_ids=[[0]]), r"group_ids\[0\] is \[0\], not hashable"),
        (dict(grad_reduction="avg"), "grad_reduction must be 'mean'"),
        (dict(loss_mask_key="loss_mask"), "loss_mask_key='loss_mask' is not in the micro-batch"),
    ],
)
def test_argument_errors(kwargs, match):
    micro_batches = [TensorDict({"response_mask": torch.ones(1, 2)}, [1])]
    with pytest.raises(MicroBatchPlanError, match=match):
        loss_weights(micro_batches, [[0]], **kwargs)


def test_mask_errors():
    with pytest.raises(ValueError, match=r"must be bool or hold only 0 and 1, got 0.5"):
        loss_weights([TensorDict({"response_mask": torch.tensor([[1.0, 0.5]])}, [1])], [[0]])
    with pytest.raises(ValueError, match=r"must be a \[b, T\] tensor"):
        loss_weights([TensorDict({"response_mask": torch.ones(3)}, [3])], [[0, 1, 2]])
    with pytest.raises(ValueError, match=r"must be a \[b, T\] tensor .*got shape \[2, 3, 4\]"):
        loss_weights([TensorDict({"response_mask": torch.ones(2, 3, 4)}, [2])], [[0, 1]])
    with pytest.raises(ValueError, match="has 2 rows in response_mask but its index list holds 1"):
        loss_weights([TensorDict({"response_mask": torch.ones(2, 2)}, [2])], [[0]])
    with pytest.raises(ValueError, match="got 1 micro-batches but 2 index lists"):
        loss_weights([TensorDict({"response_mask": torch.ones(1, 2)}, [1])], [[0], [1]])


def test_dtype_defaults_to_the_masks_floating_dtype_else_torchs_default():
    def dtypes(mask, **kwargs):
        micro_batches = [TensorDict({"response_mask": mask}, [len(mask)]), TensorDict({"response_mask": mask[:1]}, [1])]
        return [w.dtype for w in loss_weights(micro_batches, [[0, 1], []], **kwargs)]  # a dummy too

    assert dtypes(torch.ones(2, 3, dtype=torch.float64)) == [torch.float64] * 2
    assert dtypes(torch.ones(2, 3, dtype=torch.bfloat16)) == [torch.bfloat16] * 2
    assert dtypes(torch.ones(2, 3, dtype=torch.long)) == [torch.get_default_dtype()] * 2
    assert dtypes(torch.ones(2, 3, dtype=torch.bool), dtype=torch.float64) == [torch.float64] * 2
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert dtypes(torch.ones(2, 3, dtype=torch.bool)) == [torch.float64] * 2
    finally:
        torch.set_default_dtype(previous)


def test_float64_weights_are_exact_where_float32_ones_are_not():
    masks = [torch.tensor([[1, 1, 1, 0, 1, 1, 1]]), torch.tensor([[1, 1, 1, 1, 1, 1, 0]])]
    micro_batches = [TensorDict({"response_mask": m}, [1]) for m in masks]
    weights = loss_weights(micro_batches, [[0], [1]], mode="seq-mean-token-mean", dtype=torch.float64)
    assert [w.item() for w in weights] == [1 / 12, 1 / 12]  # 1 / (2 * 6), to the last bit of float64
    single = loss_weights(micro_batches, [[0], [1]], mode="seq-mean-token-mean", dtype=torch.float32)
    assert single[0].item() != 1 / 12 and single[0].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.long, torch.bool, "float64", torch.complex64, 64])
def test_a_dtype_that_is_not_a_floating_torch_dtype_is_an_error(dtype):
    with pytest.raises(MicroBatchPlanError, match=r"dtype must be a floating torch.dtype"):
        loss_weights([TensorDict({"response_mask": torch.ones(1, 2)}, [1])], [[0]], dtype=dtype)


@pytest.mark.parametrize(
    "indices, match",
    [
        ([[0, 5]], r"batch_idx_list: bin 0 holds 5, not an index into 2 items"),
        ([[0, -1]], r"batch_idx_list: bin 0 holds -1, not an index into 2 items"),
        ([[1, 1]], r"batch_idx_list: item 1 appears twice"),
        ([[0, 1.0]], r"batch_idx_list: bin 0 holds 1.0, not an index into 2 items"),
        ([[0, "1"]], r"batch_idx_list: bin 0 holds '1', not an index into 2 items"),
    ],
)
def test_index_values_must_be_the_batchs_samples(indices, match):
    with pytest.raises(MicroBatchPlanError, match=match):
        loss_weights([TensorDict({"response_mask": torch.ones(2, 2)}, [2])], indices)


def test_index_lists_as_arrays_and_tensors_are_read_as_index_lists():
    import numpy as np

    micro_batches = [TensorDict({"response_mask": torch.ones(2, 2)}, [2]), TensorDict({"response_mask": torch.ones(1, 2)}, [1])]
    for indices in ([np.array([0, 2]), np.array([1])], [torch.tensor([0, 2]), torch.tensor([1])]):
        assert [w.tolist() for w in loss_weights(micro_batches, indices, dtype=torch.float64)] == [[1 / 6, 1 / 6], [1 / 6]]


def test_one_all_reduce_in_sync_mode(monkeypatch):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        calls = []
        original = dist.all_reduce
        monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: calls.append(1) or original(*a, **k))
        weights = loss_weights([TensorDict({"response_mask": torch.ones(2, 2)}, [2])], [[0, 1]], dp_group=dist.group.WORLD)
        assert len(calls) == 1 and weights[0].tolist() == [0.25, 0.25]
        with pytest.raises(ValueError, match="mode must be one of"):
            loss_weights([TensorDict({"response_mask": torch.ones(2, 2)}, [2])], [[0, 1]], dp_group=dist.group.WORLD,
                         mode="bad")
        assert len(calls) == 2  # the error travelled through the all-reduce before being raised
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Two gloo ranks, one of them short (dummy micro-batches)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from .test_distributed import spawn_ranks

    out = tmp_path_factory.mktemp("loss")
    exit_codes = spawn_ranks([(workers.worker_main, 2, (2, str(out / "init"), str(out)))], deadline_s=DEADLINE_S)
    records = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    for record in records:
        assert "__crash__" not in record, record["__crash__"]
    assert exit_codes == [[0, 0]]
    return records


def all_samples(world: int = 2) -> TensorDict:
    return torch.cat([workers.rank_batch(rank) for rank in range(world)])


def all_pairs(world: int) -> TensorDict:
    return torch.cat([workers.pair_batch(rank) for rank in range(world)])


def pair_reference_gradient(world: int) -> torch.Tensor:
    """Gradient of the pairwise loss's mean over every pair of every rank (one pass)."""
    theta = workers.parameters().requires_grad_(True)
    workers.pair_losses(theta, all_pairs(world)).mean().backward()
    return theta.grad


@pytest.mark.parametrize("via", REFERENCES)
@pytest.mark.parametrize("mode", workers.MODES)
@pytest.mark.parametrize("variant", ["mean", "sum", "nested"])
def test_two_ranks_with_dummies_equal_the_full_batch_gradient(two_ranks, mode, variant, via):
    records = [r[f"{mode}/{variant}"] for r in two_ranks]
    assert len(records[0]["indices"]) == len(records[1]["indices"])
    assert any(part == [] for part in records[1]["indices"]), "rank 1 must be short and get dummies"
    assert not any(part == [] for part in records[0]["indices"])
    for part, weight in zip(records[1]["indices"], records[1]["weights"]):
        if not part:
            assert weight == [0.0]
    for rank, record in enumerate(records):
        lengths = workers.rank_batch(rank)["attention_mask"].sum(-1).tolist()
        assert_plan_invariants(lengths, record["indices"], workers.CAP, dummy_micro_batches=True)
    # a jagged mask's horizon is its longest row, what the batch padded as one would have
    horizon = int(all_samples()["attention_mask"].sum(-1).max()) if variant == "nested" else None
    reference = reference_gradient(all_samples(), mode, via, horizon)
    for record in records:  # both ranks hold the same reduced gradient
        assert_close(record["gradient"], reference, tolerance_for(RTOL, mode, via))


#: A step run in float32 (parameters, features, weights), against the float64 reference on the
#: same float32 inputs: float32's own rounding, 2**-24 per operation over a few dozen
#: accumulated terms, bounded by 64 units of float32's epsilon of the gradient's size.
RTOL_FLOAT32 = 64 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("via", REFERENCES)
@pytest.mark.parametrize("mode", workers.MODES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("precision", workers.PRECISIONS)
def test_two_ranks_with_dummies_are_exact_at_the_weights_precision(two_ranks, mode, reduction, precision, via):
    records = [r[f"{mode}/{reduction}/{precision}"] for r in two_ranks]
    assert any(part == [] for part in records[1]["indices"]), "rank 1 must be short and get dummies"
    expected = "torch.float32" if precision == "float32" else "torch.float64"
    assert all(record["dtypes"] == [expected] for record in records), [r["dtypes"] for r in records]
    samples = all_samples()
    if precision == "float32":  # the reference sees the very inputs the float32 step saw
        samples["features"] = samples["features"].to(torch.float32).to(torch.float64)
    reference = reference_gradient(samples, mode, via)
    tolerance = tolerance_for(RTOL_FLOAT32 if precision == "float32" else RTOL_FLOAT64, mode, via)
    for record in records:
        assert_close(record["gradient"], reference, tolerance)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_two_ranks_pairs_weighted_per_pair_equal_the_one_pass_pairwise_loss(two_ranks, reduction):
    records = [r[f"pairs/{reduction}"] for r in two_ranks]
    assert any(part == [] for part in records[1]["indices"]), "rank 1 must be short and get dummies"
    for rank, record in enumerate(records):
        assert all(part[0::2] == [i for i in part if i % 2 == 0] for part in record["indices"]), "pairs kept whole"
        lengths = workers.pair_batch(rank)["attention_mask"].sum(-1).tolist()
        assert_plan_invariants(lengths, record["indices"], workers.PAIR_CAP, dummy_micro_batches=True, force_group_size=2)
    reference = pair_reference_gradient(2)
    for record in records:
        assert_close(record["gradient"], reference, RTOL_FLOAT64)


def test_two_ranks_agree_on_a_missing_key(two_ranks):
    errors = [r["error/missing_key"]["error"] for r in two_ranks]
    assert "loss_mask_key='no_such_mask' is not in the micro-batch" in errors[1]
    assert "rank 1 of the data-parallel group failed" in errors[0]


def test_two_ranks_agree_on_a_mask_that_is_not_batch_by_sequence(two_ranks):
    """A [b, T, k] mask would count each token k times: rank 1's is an error on both ranks."""
    errors = [r["error/three_d_mask"]["error"] for r in two_ranks]
    assert errors[1] is not None and "must be a [b, T] tensor" in errors[1] and ", 2]" in errors[1]
    assert errors[0] is not None and "rank 1 of the data-parallel group failed" in errors[0]


def test_a_three_d_mask_would_have_counted_each_token_k_times():
    """What the check prevents: summed over its last two dimensions, a [b, T, k] mask gives k
    times the loss tokens of the [b, T] one, and token-mean weights k times too small."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    right = loss_weights([TensorDict({"response_mask": mask}, [2])], [[0, 1]], dtype=torch.float64)[0]
    assert right.tolist() == [1 / 3, 1 / 3]
    with pytest.raises(ValueError, match=r"got shape \[2, 3, 2\]"):
        loss_weights([TensorDict({"response_mask": mask[..., None].expand(2, 3, 2)}, [2])], [[0, 1]])


def test_two_ranks_agree_on_a_mask_that_is_not_zero_one(two_ranks):
    errors = [r["error/half_mask"]["error"] for r in two_ranks]
    assert "must be bool or hold only 0 and 1, got 0.5" in errors[1]
    assert "rank 1 of the data-parallel group failed" in errors[0]


def test_two_ranks_that_pass_different_modes_both_raise(two_ranks):
    errors = [r["error/mismatched_mode"] for r in two_ranks]
    assert errors[0] == errors[1] and errors[0]["code"] == MicroBatchPlanError.MISMATCHED_ARGUMENTS
    assert "passed different arguments to loss_weights" in errors[0]["error"]


def test_two_ranks_that_pass_different_scale_factors_or_groups_both_raise(two_ranks):
    scale = [r["error/mismatched_scale"] for r in two_ranks]
    assert scale[0] == scale[1] and scale[0]["code"] == MicroBatchPlanError.MISMATCHED_ARGUMENTS
    assert "loss_scale_factor by rank [9.0, 16.0]" in scale[0]["error"]
    groups = [r["error/groups_on_one_rank"] for r in two_ranks]
    assert groups[0] == groups[1] and groups[0]["code"] == MicroBatchPlanError.MISMATCHED_ARGUMENTS
    assert "the unit (samples, or groups) by rank ['groups', 'samples']" in groups[0]["error"]


def test_two_ranks_that_disagree_on_dummies_both_raise(two_ranks):
    errors = [r["error/mismatched_dummies"] for r in two_ranks]
    assert errors[0] == errors[1] and errors[0]["code"] == MicroBatchPlanError.MISMATCHED_ARGUMENTS
    assert "dummy_micro_batches from 0 to 1" in errors[0]["error"]


# ---------------------------------------------------------------------------------------------
# Context parallel: 2 DP x 2 CP gloo ranks, each CP rank with its shard of every sequence
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dp_cp_ranks(tmp_path_factory):
    from . import loss_cp_workers
    from .test_distributed import spawn_ranks

    out = tmp_path_factory.mktemp("loss_cp")
    world = loss_cp_workers.DP * loss_cp_workers.CP
    exit_codes = spawn_ranks([(loss_cp_workers.worker_main, world, (world, str(out / "init"), str(out)))],
                             deadline_s=DEADLINE_S)
    records = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]
    for record in records:
        assert "__crash__" not in record, record["__crash__"]
    assert exit_codes == [[0] * world]
    return records


@pytest.mark.parametrize("via", REFERENCES)
@pytest.mark.parametrize("mode", workers.MODES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_context_parallel_shards_with_cp_group_equal_the_full_batch_gradient(dp_cp_ranks, mode, reduction, via):
    records = [r[f"{mode}/{reduction}"] for r in dp_cp_ranks]
    assert records[0]["indices"] == records[1]["indices"] and records[2]["indices"] == records[3]["indices"]
    assert any(part == [] for part in records[2]["indices"]), "replica 1 must be short and get dummies"
    reference = reference_gradient(all_samples(), mode, via)
    for record in records:
        assert_close(record["gradient"], reference, tolerance_for(RTOL_FLOAT64, mode, via))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_context_parallel_pairs_equal_the_one_pass_pairwise_loss(dp_cp_ranks, reduction):
    records = [r[f"pairs/{reduction}"] for r in dp_cp_ranks]
    assert any(part == [] for part in records[2]["indices"]), "replica 1 must be short and get dummies"
    reference = pair_reference_gradient(2)
    for record in records:
        assert_close(record["gradient"], reference, RTOL_FLOAT64)


@pytest.mark.parametrize("mode, reduction", [("token-mean", "sum"), ("seq-mean-token-mean", "mean"),
                                             ("seq-mean-token-sum", "mean"), ("seq-mean-token-sum-norm", "mean")])
def test_context_parallel_shards_counted_over_dp_alone_are_wrong(dp_cp_ranks, mode, reduction):
    """prime-rl's miscount (its issue #2562): without cp_group the counts are the shards'."""
    gradient = torch.tensor(dp_cp_ranks[0][f"{mode}/{reduction}/dp-only"]["gradient"], dtype=torch.float64)
    reference = reference_gradient(all_samples(), mode)
    assert float((gradient - reference).abs().max()) > 0.05 * float(reference.abs().max())


def test_context_parallel_errors_are_agreed_by_all_four_ranks(dp_cp_ranks):
    errors = [r["error/missing_key"]["error"] for r in dp_cp_ranks]
    assert "loss_mask_key='no_such_mask' is not in the micro-batch" in errors[3]
    assert "rank 1 of the context-parallel group (global rank 3) failed" in errors[2]
    assert all("rank 1 of the data-parallel group" in error for error in errors[:2]), errors[:2]
    mismatched = [r["error/more_samples"] for r in dp_cp_ranks]
    assert all(record["code"] == MicroBatchPlanError.MISMATCHED_ARGUMENTS for record in mismatched), mismatched
    assert mismatched[2]["error"] == mismatched[3]["error"]
    assert "the ranks of cp_group hold different numbers of samples or groups ((samples, units) by rank [(2, 2), (3, 3)])" \
        in mismatched[2]["error"]
    assert all("rank 1 of the data-parallel group" in record["error"] for record in mismatched[:2])


# ---------------------------------------------------------------------------------------------
# Three gloo ranks: every mode and the pairs, uneven ranks (10, 2 and 7 samples), dummies
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    from .test_distributed import spawn_ranks

    out = tmp_path_factory.mktemp("loss3")
    exit_codes = spawn_ranks([(workers.worker_main, 3, (3, str(out / "init"), str(out)))], deadline_s=DEADLINE_S)
    records = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(3)]
    for record in records:
        assert "__crash__" not in record, record["__crash__"]
    assert exit_codes == [[0, 0, 0]]
    return records


@pytest.mark.parametrize("via", REFERENCES)
@pytest.mark.parametrize("mode", workers.MODES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_three_ranks_with_dummies_equal_the_full_batch_gradient(three_ranks, mode, reduction, via):
    records = [r[f"{mode}/{reduction}/float64"] for r in three_ranks]
    assert len({len(record["indices"]) for record in records}) == 1
    assert any(part == [] for part in records[1]["indices"]), "rank 1 must be short and get dummies"
    reference = reference_gradient(all_samples(3), mode, via)
    for record in records:
        assert_close(record["gradient"], reference, tolerance_for(RTOL_FLOAT64, mode, via))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_three_ranks_pairs_equal_the_one_pass_pairwise_loss(three_ranks, reduction):
    records = [r[f"pairs/{reduction}"] for r in three_ranks]
    assert any(part == [] for part in records[1]["indices"]), "rank 1 must be short and get dummies"
    reference = pair_reference_gradient(3)
    for record in records:
        assert_close(record["gradient"], reference, RTOL_FLOAT64)


# ---------------------------------------------------------------------------------------------
# Groups on one rank: ids, uneven sizes, the mistake they prevent
# ---------------------------------------------------------------------------------------------

#: Nine samples in three groups of uneven size whose members are not consecutive, and the
#: micro-batches that keep each group whole.
GROUP_IDS = ["b", "a", "c", "b", "a", "c", "c", "b", "b"]
GROUPED_PARTS = [[0, 3, 7, 8], [1, 4], [2, 5, 6]]


def grouped_batch() -> TensorDict:
    batch = workers.rank_batch(2)  # 7 samples
    return torch.cat([batch, workers.rank_batch(1)])  # 9


def group_reference_gradient(batch: TensorDict, mode: str) -> torch.Tensor:
    """The group means written from their definitions: every group weighs 1/G."""
    theta = workers.parameters().requires_grad_(True)
    mask = batch["loss_mask"].to(torch.float64)
    per_sequence = (workers.token_loss(theta, batch["features"]) * mask).sum(-1)
    groups = sorted(set(GROUP_IDS))
    total = 0.0
    for group in groups:
        members = [i for i, g in enumerate(GROUP_IDS) if g == group]
        loss, tokens = per_sequence[members].sum(), mask[members].sum()
        if mode == "seq-mean-token-mean":
            total = total + (loss / tokens if tokens > 0 else 0.0)
        elif mode == "seq-mean-token-sum":
            total = total + loss
        else:  # seq-mean-token-sum-norm
            total = total + loss / mask.shape[-1]
    (total / len(groups)).backward()
    return theta.grad


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_group_ids_make_each_group_the_unit_of_the_mean(mode):
    batch = grouped_batch()
    micro_batches = [batch[part] for part in GROUPED_PARTS]
    weights = loss_weights(micro_batches, GROUPED_PARTS, loss_mask_key="loss_mask", mode=mode, dtype=torch.float64,
                           group_ids=GROUP_IDS)
    for part, weight in zip(GROUPED_PARTS, weights):  # one weight per group, shared by its members
        assert len(set(weight.tolist())) == 1, (part, weight)
    theta = workers.parameters().requires_grad_(True)
    for micro_batch, weight in zip(micro_batches, weights):
        (workers.token_loss(theta, micro_batch["features"]) * micro_batch["loss_mask"] * weight[:, None]).sum().backward()
    assert_close(theta.grad, group_reference_gradient(batch, mode), RTOL_FLOAT64)
    # the same groups as tensor or array ids; token modes ignore the groups
    as_codes = torch.tensor([ord(g) for g in GROUP_IDS])
    again = loss_weights(micro_batches, GROUPED_PARTS, loss_mask_key="loss_mask", mode=mode, dtype=torch.float64,
                         group_ids=as_codes)
    assert all(torch.equal(a, b) for a, b in zip(weights, again))
    scalars = loss_weights(micro_batches, GROUPED_PARTS, loss_mask_key="loss_mask", mode=mode, dtype=torch.float64,
                           group_ids=list(as_codes))  # 0-d tensors, which hash by identity: read by value
    assert all(torch.equal(a, b) for a, b in zip(weights, scalars))
    plain = loss_weights(micro_batches, GROUPED_PARTS, loss_mask_key="loss_mask", dtype=torch.float64)
    grouped = loss_weights(micro_batches, GROUPED_PARTS, loss_mask_key="loss_mask", dtype=torch.float64,
                           group_ids=GROUP_IDS)
    assert all(torch.equal(a, b) for a, b in zip(plain, grouped))


def test_a_group_split_over_micro_batches_is_an_error():
    batch = grouped_batch()
    parts = [[0, 3, 7], [8, 1, 4], [2, 5, 6]]
    with pytest.raises(MicroBatchPlanError, match=r"group 'b' is split: sample 0 is in micro-batch 0 and sample 8 in "
                                                  r"micro-batch 1"):
        loss_weights([batch[p] for p in parts], parts, loss_mask_key="loss_mask", group_ids=GROUP_IDS)
    with pytest.raises(MicroBatchPlanError, match=r"pass either force_group_size \(got 3\) or group_ids, not both"):
        loss_weights([batch[p] for p in GROUPED_PARTS], GROUPED_PARTS, loss_mask_key="loss_mask", group_ids=GROUP_IDS,
                     force_group_size=3)


def test_counting_a_pairs_members_apart_would_be_caught():
    """Sequences as the unit (no groups) count each pair twice: the pairwise loss's gradient
    comes out half of the one-pass mean over pairs, so the pair tests above can fail."""
    batch = workers.pair_batch(0)
    micro_batches, indices = rearrange_micro_batches(batch, workers.PAIR_CAP, force_group_size=2)
    assert len(micro_batches) >= 2
    reference = pair_reference_gradient(1)
    for groups, expected in ((2, 1.0), (1, 0.5)):
        weights = loss_weights(micro_batches, indices, loss_mask_key="loss_mask", mode="seq-mean-token-sum",
                               dtype=torch.float64, force_group_size=groups)
        theta = workers.parameters().requires_grad_(True)
        for micro_batch, weight in zip(micro_batches, weights):
            (workers.pair_losses(theta, micro_batch) * weight[0::2]).sum().backward()
        assert_close(theta.grad, expected * reference, RTOL_FLOAT64)


def test_the_norm_modes_horizon_defaults_to_the_widest_mask_and_takes_a_constant():
    masks = [torch.tensor([[1, 1, 0, 0]]), torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])]
    micro_batches = [TensorDict({"response_mask": m}, [len(m)]) for m in masks]
    default = loss_weights(micro_batches, [[1], [0, 2]], mode="seq-mean-token-sum-norm", dtype=torch.float64)
    assert torch.cat(default).tolist() == [1 / 12] * 3  # 3 sequences x a horizon of 4
    fixed = loss_weights(micro_batches, [[1], [0, 2]], mode="seq-mean-token-sum-norm", dtype=torch.float64,
                         loss_scale_factor=512)
    assert torch.cat(fixed).tolist() == [1 / (3 * 512)] * 3
    rows = [torch.tensor([1, 1]), torch.tensor([1, 0, 1, 1, 0])]  # jagged: the longest row, 5
    nested = TensorDict({"response_mask": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, [2])
    assert loss_weights([nested], [[0, 1]], mode="seq-mean-token-sum-norm", dtype=torch.float64)[0].tolist() == [0.1, 0.1]
    summed = loss_weights(micro_batches, [[1], [0, 2]], mode="token-sum", dtype=torch.float64, grad_reduction="sum")
    assert torch.cat(summed).tolist() == [1.0] * 3
