"""OpenRLHF 0.11.2's own callers, alone and with seqbal installed by ``seqbal.integrations.openrlhf``.

The rollout split (``RemoteExperienceMaker.split_rollout_samples``, the driver) runs in this
process; the training step (``NaiveReplayBuffer.setup_dynamic_batch``) runs on 2 gloo ranks
with a hard deadline. OpenRLHF hard-codes ``torch.cuda.current_device()``: the runs of
OpenRLHF's own method patch it in the test (never in seqbal). Skipped, with the reason, where
OpenRLHF is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from types import SimpleNamespace as NS

import numpy as np
import pytest

from seqbal.integrations import openrlhf as seqbal_openrlhf

from .invariants import assert_plan_invariants

CAP = 4096

try:
    import torch

    from .trainer_stubs import import_openrlhf_modules

    import_openrlhf_modules()
    import openrlhf.trainer.ppo_utils.experience_maker as experience_maker
    import openrlhf.trainer.ppo_utils.replay_buffer as replay_buffer
    from openrlhf.trainer.ppo_utils.experience import Experience
except Exception as error:  # noqa: BLE001 - any import failure means "no usable OpenRLHF here"
    OPENRLHF_MISSING = f"OpenRLHF does not import here ({type(error).__name__}: {error})"
else:
    OPENRLHF_MISSING = None

needs_openrlhf = pytest.mark.skipif(OPENRLHF_MISSING is not None, reason=OPENRLHF_MISSING or "")


def shipped_steps(count=500, size=32, seed=0):
    """Random ``size``-sample steps of seqbal's shipped rollout lengths."""
    lengths = np.loadtxt(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt", dtype=np.int64)
    rng = np.random.default_rng(seed)
    return [lengths[rng.choice(len(lengths), size, replace=False)].tolist() for _ in range(count)]


def sample(length, actions=None):
    actions = max(1, length // 2) if actions is None else actions
    sequences = torch.arange(length)[None, :]
    return Experience(
        sequences=sequences,
        attention_mask=torch.ones_like(sequences),
        action_mask=torch.ones(1, actions, dtype=torch.bool),
        total_length=torch.tensor([length]),
        response_length=torch.tensor([actions]),
    )


def maker(actors=4, cap=CAP):
    args = NS(
        train=NS(dynamic_batch_enable=True),
        rollout=NS(max_tokens_per_gpu=cap),
        actor=NS(num_nodes=1, num_gpus_per_node=actors),
        ds=NS(ring_attn_size=1, tensor_parallel_size=1),
        algo=NS(advantage=NS(estimator="group_norm")),
    )
    strategy = NS(args=args)
    return experience_maker.RemoteExperienceMaker(None, None, None, None, None, strategy, NS(pad_token_id=0))


def split_tokens(micro_batches):
    return [int(mb.total_length.sum()) for mb in micro_batches]


@needs_openrlhf
def test_openrlhf_alone_rounds_the_rollout_split_down_over_the_cap():
    """Five 3,000-token samples at cap 4,096 on 4 actors: OpenRLHF's own split gives 4
    micro-batches, one of 6,000 tokens."""
    tokens = split_tokens(maker().split_rollout_samples([sample(3000) for _ in range(5)]))
    assert len(tokens) == 4 and max(tokens) == 6000


@needs_openrlhf
def test_seqbal_rollout_split_refuses_what_cannot_be_made():
    with seqbal_openrlhf.installed():
        with pytest.raises(ValueError, match=r"5 samples, 15000 tokens .* cap 4096 on 4 effective actors.*need at least 8"):
            maker().split_rollout_samples([sample(3000) for _ in range(5)])
        with pytest.raises(ValueError, match="exceeds max_token_len"):
            maker().split_rollout_samples([sample(5000)] + [sample(100) for _ in range(7)])


@needs_openrlhf
def test_rollout_split_on_shipped_lengths_alone_and_with_seqbal():
    """128-sample rollouts on 4 actors: OpenRLHF's own split overshoots on some, seqbal never,
    with a count that is a multiple of 4 and every sample once, in order of the chunks."""
    rollouts = shipped_steps(count=20, size=128, seed=1)
    alone = [max(split_tokens(maker().split_rollout_samples([sample(n) for n in lens]))) for lens in rollouts]
    assert max(alone) > CAP
    with seqbal_openrlhf.installed():
        for lens in rollouts:
            samples = [sample(n) for n in lens]
            micro_batches = maker().split_rollout_samples(samples)
            indices = [[i for mb_index in [mb.index] for i in mb_index] for mb in micro_batches]
            assert_plan_invariants(lens, [sorted(part) for part in indices], CAP, num_batches_divided_by=4)


@needs_openrlhf
def test_install_uninstall_restores_openrlhfs_methods():
    classes = (replay_buffer.NaiveReplayBuffer, experience_maker.RemoteExperienceMaker)
    originals = [vars(classes[0])["setup_dynamic_batch"], vars(classes[1])["split_rollout_samples"]]
    changed = seqbal_openrlhf.install()
    try:
        assert changed == [("NaiveReplayBuffer", "setup_dynamic_batch"), ("RemoteExperienceMaker", "split_rollout_samples")]
        assert classes[0].setup_dynamic_batch.__wrapped__ is seqbal_openrlhf.setup_dynamic_batch
        assert seqbal_openrlhf.install() == [] and seqbal_openrlhf.is_installed()
    finally:
        seqbal_openrlhf.uninstall()
    assert [vars(classes[0])["setup_dynamic_batch"], vars(classes[1])["split_rollout_samples"]] == originals
    assert not seqbal_openrlhf.is_installed() and seqbal_openrlhf.uninstall() == []


def test_install_without_openrlhf_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, seqbal_openrlhf.REPLAY_BUFFER_MODULE, None)
    with pytest.raises(ImportError, match="needs OpenRLHF"):
        seqbal_openrlhf.install()
    assert not seqbal_openrlhf.is_installed()


def test_importing_the_adapter_imports_neither_openrlhf_nor_torch():
    code = "import sys; import seqbal.integrations.openrlhf\nprint(sorted(m for m in ('openrlhf', 'torch') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


# ---------------------------------------------------------------------------------------------
# The training step on 2 gloo ranks
# ---------------------------------------------------------------------------------------------


def overshooting_step():
    """The first shipped 32-sample step on which OpenRLHF's own plan exceeds the cap."""
    from openrlhf.utils.seqlen_balancing import get_minimum_num_micro_batch_size, get_seqlen_balanced_partitions

    for lens in shipped_steps():
        parts = get_seqlen_balanced_partitions(lens, get_minimum_num_micro_batch_size(lens, CAP, 1, 1), False)
        if max(sum(lens[i] for i in part) for part in parts) > CAP:
            return lens
    raise AssertionError("no shipped step overshoots")


def step_cases(rank):
    """Per case, this rank's buffer lengths (one 32-sample step each)."""
    shipped = overshooting_step()
    return {
        "shipped_overshoot": shipped,  # the same step on both ranks
        "uneven": [3000] * 32 if rank == 0 else [50] * 32,
        "rank0_sample_over_cap": ([5000] + [100] * 31) if rank == 0 else [100] * 32,
    }


def _training_rank(rank, world, init_file, out_dir):
    """One actor rank: every case with OpenRLHF's own method, then with seqbal's. Never asserts."""
    from datetime import timedelta

    import torch.distributed as dist
    from tests.process_group import close_process_group

    import_openrlhf_modules()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    args = NS(
        train=NS(batch_size=32 * world, max_tokens_per_gpu=CAP),
        rollout=NS(batch_size=32 * world, n_samples_per_prompt=1),
        ds=NS(ring_attn_size=1, tensor_parallel_size=1),
    )
    strategy = NS(args=args, ds_device_mesh={"dp": NS(get_group=lambda: dist.group.WORLD)}, world_size=world)

    def all_reduce(data, op="mean"):  # DeepspeedStrategy.all_reduce on a tensor, op "max" (what the step calls)
        dist.all_reduce(data, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return data

    strategy.all_reduce = all_reduce
    records = {}
    for mode in ("openrlhf", "seqbal"):
        if mode == "seqbal":
            seqbal_openrlhf.install()
        for name, lengths in step_cases(rank).items():
            torch.cuda.current_device = lambda: 0  # OpenRLHF's constructor: torch.device("cuda:0")
            buffer = replay_buffer.NaiveReplayBuffer(1, dynamic_batch=True)
            torch.cuda.current_device = lambda: "cpu"  # OpenRLHF's own collectives, on gloo
            buffer.items = [sample(n) for n in lengths]
            try:
                buffer.setup_dynamic_batch(strategy)
                records[f"{mode}/{name}"] = {
                    "lengths": lengths,
                    "indices": buffer.dynamic_indices,
                    "loss_scale": buffer.dynamic_sample_loss_scale,
                    "num_tokens": buffer.dynamic_batch_num_tokens,
                    "global_batch": buffer.dynamic_global_batch_size,
                    "optimizer_step": buffer.dynamic_optimizer_step,
                }
            except ValueError as error:
                records[f"{mode}/{name}"] = {"error": str(error)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(records, handle)
    close_process_group()


@pytest.fixture(scope="module")
def training_records(tmp_path_factory):
    from .test_distributed import spawn_ranks

    out = tmp_path_factory.mktemp("openrlhf")
    exit_codes = spawn_ranks([(_training_rank, 2, (2, str(out / "init"), str(out)))], deadline_s=300)
    assert exit_codes == [[0, 0]]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def largest(record):
    return max(sum(record["lengths"][i] for i in part) for part in record["indices"])


@needs_openrlhf
def test_openrlhf_alone_overshoots_the_cap_in_its_training_step(training_records):
    for record in training_records:
        assert largest(record["openrlhf/shipped_overshoot"]) > CAP
        assert largest(record["openrlhf/rank0_sample_over_cap"]) >= 5000 or record is training_records[1]


@needs_openrlhf
@pytest.mark.parametrize("case", ["shipped_overshoot", "uneven"])
def test_seqbal_training_step_holds_the_cap_with_equal_counts(training_records, case):
    records = [r[f"seqbal/{case}"] for r in training_records]
    assert len(records[0]["indices"]) == len(records[1]["indices"])
    for record in records:
        assert_plan_invariants(record["lengths"], record["indices"], CAP)
        # OpenRLHF's bookkeeping: shares of the step, the last micro-batch steps the optimizer
        assert sum(record["loss_scale"]) == pytest.approx(1.0)
        assert record["optimizer_step"] == [0] * (len(record["indices"]) - 1) + [1]
        actions = sum(max(1, n // 2) for r in records for n in r["lengths"])
        assert record["num_tokens"] == [actions] * len(record["indices"])
        assert record["global_batch"] == [64.0] * len(record["indices"])


@needs_openrlhf
def test_seqbal_training_step_over_cap_on_one_rank_raises_on_both(training_records):
    errors = [r["seqbal/rank0_sample_over_cap"].get("error", "") for r in training_records]
    assert "exceeds max_token_len" in errors[0] and "OpenRLHF training step 0" in errors[0], errors
    assert "rank 0 of the data-parallel group failed" in errors[1], errors


# ---------------------------------------------------------------------------------------------
# plan_rollout_split's arguments (issue 30.6; no OpenRLHF needed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("actors", [np.int64(2), np.uint8(2), np.int32(2), 2])
def test_rollout_split_takes_numpy_integer_actor_counts(actors):
    assert seqbal_openrlhf.plan_rollout_split([3000, 3000, 1000, 1000], CAP, actors) == [[0, 3], [1, 2]]
    assert seqbal_openrlhf.plan_rollout_split(np.array([3000, 3000, 1000, 1000]), np.int64(CAP), actors) == [[0, 3], [1, 2]]


@pytest.mark.parametrize(
    ("lengths", "actors", "named"),
    [
        ([5, None, 7], 2, "lengths must hold integers"),
        (["5", "7"], 2, "lengths must hold integers"),
        ([5, 2.5], 2, "lengths must hold integers"),
        (np.array(5), 2, "lengths must be one-dimensional"),
        ([[5, 7]], 2, "lengths must be one-dimensional"),
        ([5, -1], 2, "sample 1 has a negative length"),
        ([5, 7], 2.0, "actors (the effective actor count) must be a positive int, got 2.0"),
        ([5, 7], np.int64(0), "actors (the effective actor count) must be a positive int"),
        ([5, 7], True, "actors (the effective actor count) must be a positive int, got True"),
        ([5, 7], None, "actors (the effective actor count) must be a positive int, got None"),
    ],
)
def test_rollout_split_bad_arguments_are_value_errors_naming_them(lengths, actors, named):
    with pytest.raises(ValueError, match="OpenRLHF's rollout split") as caught:
        seqbal_openrlhf.plan_rollout_split(lengths, CAP, actors)
    assert named in str(caught.value)
