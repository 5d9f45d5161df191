"""seqbal's TransferQueue sampler against TransferQueue 0.1.11's own code: its own
``SeqlenBalancedSampler`` tests (shipped in its distribution) run against ``SeqbalSampler``, and
the promises of the cap, groups, caching and checkpoints on random streams."""

from __future__ import annotations

import importlib.util
import random
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("transfer_queue.sampler", reason="TransferQueue 0.1.11 is not installed")

from seqbal import CostModel  # noqa: E402
from seqbal.integrations.transfer_queue import SeqbalSampler, StepSampler  # noqa: E402
from tests.deadline import run_with_deadline  # noqa: E402

CAP = 4096


class Partition:
    """What the controller hands the sampler: per-sample custom_meta."""

    def __init__(self, lengths: dict[int, int]) -> None:
        self.lengths = lengths

    def get_custom_meta(self, indexes):
        return {i: {"total_lengths": self.lengths[i]} for i in indexes if i in self.lengths}


def own_tests_file() -> Path:
    """TransferQueue's tests/test_samplers.py as its wheel installs it (top-level ``tests``)."""
    root = Path(list(importlib.util.find_spec("transfer_queue").submodule_search_locations)[0]).parent
    path = root / "tests" / "test_samplers.py"
    if not path.exists():
        pytest.skip(f"TransferQueue's own tests are not installed at {path}")
    return path


def test_transfer_queues_own_sampler_tests_pass_against_seqbal(tmp_path):
    """Every test of TransferQueue's ``TestSeqlenBalancedSampler``, with ``SeqlenBalancedSampler``
    bound to seqbal's sampler (the module's KK helpers stay TransferQueue's)."""
    source = own_tests_file().read_text()
    pattern = re.compile(r"from transfer_queue\.sampler\.seqlen_balanced_sampler import \(\n\s+SeqlenBalancedSampler,\n")
    assert pattern.search(source), "TransferQueue's test imports changed"
    source = pattern.sub(
        "from seqbal.integrations.transfer_queue import SeqbalSampler as SeqlenBalancedSampler\n"
        "from transfer_queue.sampler.seqlen_balanced_sampler import (\n", source)
    (tmp_path / "test_tq_samplers.py").write_text(source)
    result = run_with_deadline(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "TestSeqlenBalancedSampler",
         "--rootdir", str(tmp_path), str(tmp_path / "test_tq_samplers.py")],
        deadline_s=300, cwd=str(tmp_path), what="TransferQueue's sampler tests", merge_stderr=True)
    assert result.returncode == 0, result.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    assert passed >= 14 and "failed" not in result.stdout, result.stdout[-2000:]


def check_batch(sampler, ready, batch_size, partition, batch_index, lengths, size):
    """Ask every rank, check the answers, return the taken indexes."""
    shares = []
    for rank in reversed(range(sampler.dp_size)):  # any rank may ask first
        shares.append(sampler.sample(ready, batch_size, "train", "p", dp_rank=rank, batch_index=batch_index,
                                     partition=partition)[0])
    shares.reverse()
    again = [sampler.sample(ready, batch_size, "train", "p", dp_rank=r, batch_index=batch_index,
                            partition=partition)[0] for r in range(sampler.dp_size)]
    assert again == shares, "a repeated call got another answer"
    if not any(shares):
        return set()
    taken = [i for share in shares for i in share]
    assert len(taken) == len(set(taken)) == batch_size * sampler.dp_size
    assert set(taken) <= set(ready)
    counts = set()
    for rank, share in enumerate(shares):
        mbs = sampler.micro_batches("p", "train", batch_index, rank)
        counts.add(len(mbs))
        assert [i for mb in mbs for i in mb] == share
        for mb in mbs:
            assert sum(lengths[i] for i in mb) <= CAP
            for i in mb:  # whole groups (produced aligned: i - i % size ...), in one micro-batch
                assert all(j in mb for j in range(i - i % size, i - i % size + size)), f"group of {i} split"
    assert len(counts) == 1, f"ranks run different counts: {counts}"
    return set(taken)


@pytest.mark.parametrize("seed", range(6))
def test_cap_groups_cache_and_resume_on_a_stream(seed):
    rng = random.Random(seed)
    size, dp, batch = rng.choice([1, 2, 4]), rng.choice([1, 2, 3]), None
    batch = size * rng.randint(1, 4)
    lengths, ready, produced = {}, [], 0
    sampler = SeqbalSampler(n_samples_per_prompt=size, dp_size=dp, max_token_len=CAP)
    twin, answers, resumed_at = None, [], 3
    for batch_index in range(8):
        for _ in range(rng.randint(0, 3 * dp)):  # whole groups become ready
            for i in range(produced, produced + size):
                lengths[i] = rng.randint(1, CAP // size)
                ready.append(i)
            produced += size
        partition = Partition(lengths)
        if batch_index == resumed_at:
            twin = SeqbalSampler(n_samples_per_prompt=size, dp_size=dp, max_token_len=CAP)
            twin.load_checkpoint(sampler.save_checkpoint())
        taken = check_batch(sampler, ready, batch, partition, batch_index, lengths, size)
        if twin is not None:
            twin_shares = [twin.sample(ready, batch, "train", "p", dp_rank=r, batch_index=batch_index,
                                       partition=partition)[0] for r in range(dp)]
            assert twin_shares == [sampler.sample(ready, batch, "train", "p", dp_rank=r, batch_index=batch_index,
                                                  partition=partition)[0] for r in range(dp)]
        answers.append(taken)
        ready = [i for i in ready if i not in taken]
    consumed = set().union(*answers)
    assert not consumed & set(ready)


def test_a_group_over_the_cap_names_it_and_consumes_nothing():
    sampler = SeqbalSampler(n_samples_per_prompt=2, dp_size=1, max_token_len=100)
    with pytest.raises(ValueError, match=r"group exceeds max_token_len: group 0 \(indices \[0, 1\]\) costs 120"):
        sampler.sample([0, 1, 2, 3], 2, "t", "p", dp_rank=0, batch_index=0, partition=Partition({0: 60, 1: 60, 2: 1, 3: 1}))
    with pytest.raises(ValueError, match="sample 2 has no total_lengths"):
        sampler.sample([2, 3], 2, "t", "p", dp_rank=0, batch_index=0, partition=Partition({3: 1}))
    assert sampler.sample([2, 3], 2, "t", "p", dp_rank=0, batch_index=0, partition=Partition({2: 1, 3: 1}))[0] == [2, 3]


def test_the_controller_accepts_it_and_it_needs_no_base_without_transfer_queue():
    from transfer_queue.sampler import BaseSampler

    assert isinstance(SeqbalSampler(), BaseSampler) and issubclass(SeqbalSampler, StepSampler)
    assert not issubclass(StepSampler, BaseSampler)
    sampler = SeqbalSampler(n_samples_per_prompt=1, dp_size=2, max_token_len=10, cost_model=CostModel(padded=True))
    share = sampler.sample([0, 1, 2], 1, "t", "p", dp_rank=1, batch_index=0, partition=Partition({0: 4, 1: 6, 2: 5}))[0]
    assert len(share) == 1
    assert sampler.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 0})


def test_transfer_queue_controller_with_producers_two_consumers_and_a_resume(tmp_path):
    """TransferQueue's controller (a Ray actor, local cluster on the CPU) with SeqbalSampler:
    producers put GRPO rollouts while ranks 0 and 1 read; checkpointed, shut down, restarted
    with a fresh sampler and restored halfway. Every read within the cap in every micro-batch,
    groups whole, the same count on both ranks, and no sample read twice or lost."""
    import json
    import pickle

    from tests.transfer_queue_workers import BATCH, CAP, DP, GROUP, ROUNDS

    result = run_with_deadline([sys.executable, "-m", "tests.transfer_queue_workers", str(tmp_path)],
                               deadline_s=420, cwd=str(Path(__file__).resolve().parent.parent),
                               what="TransferQueue's controller run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    lengths = {int(k): v for k, v in record["lengths"].items()}
    reads = {tuple(map(int, k.split(":"))): v for k, v in record["reads"].items()}
    with open(tmp_path / "final" / "controller_state.pkl", "rb") as handle:
        sampler_state = pickle.load(handle)["sampler"]
    plans = sampler_state["plans"]
    assert sorted(b for b, r in reads) == sorted(b for b in range(ROUNDS) for _ in range(DP)), "a batch unread"
    read = [i for share in reads.values() for i in share]
    assert len(read) == len(set(read)) == ROUNDS * DP * BATCH, "a sample read twice"
    for (batch, rank), share in reads.items():
        # the controller passes neither partition_id nor task_name to its sampler: batches are
        # keyed by batch_index alone there (for TransferQueue's own sampler too)
        micro = plans[next(key for key in plans if key[2] == batch)]
        assert len({len(r) for r in micro}) == 1, "ranks run different counts"
        assert [i for mb in micro[rank] for i in mb] == share, "the read is not the planned share"
        for mb in micro[rank]:
            assert sum(lengths[i] for i in mb) <= CAP
            for i in mb:
                assert all(j in mb for j in range(i - i % GROUP, i - i % GROUP + GROUP)), "a group split"
    (_, pending_state), = sampler_state["planners"].values()
    pending = set(pending_state["pool"]["indices"])
    assert set(read) | pending == set(lengths) and not set(read) & pending, "a sample lost"
