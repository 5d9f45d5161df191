"""seqbal.integrations.torchtitan: plan_rows everywhere, and torchtitan 0.3.0's own RL Batcher.

The Batcher tests load the unchanged ``torchtitan/experiments/rl/components/batcher.py`` on the
CPU. Importing it the ordinary way runs ``torchtitan.experiments.rl``'s ``__init__``, which
imports vLLM; the ``batcher_module`` fixture registers, for the test only, empty stand-ins for
the two parent packages (``torchtitan.experiments`` and ``torchtitan.experiments.rl``, with
their real directories as ``__path__``) so that the batcher, ``types.py`` and the
observability metrics it imports run as shipped, without the package ``__init__``. The stand-ins
and every module loaded through them are removed afterwards. No file of torchtitan is changed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest

from seqbal import calculate_workload
from seqbal.integrations import torchtitan as seqbal_torchtitan
from seqbal.integrations.torchtitan import plan_rows


# ---------------------------------------------------------------------------------------------
# plan_rows: no torchtitan needed
# ---------------------------------------------------------------------------------------------


def _check_grid(grid, lengths, seq_len, local_batch_size, dp_degree):
    flat = [i for cells in grid for cell in cells for row in cell for i in row]
    assert sorted(flat) == list(range(len(lengths))), "every sample exactly once"
    for cells in grid:
        assert len(cells) == dp_degree
        for cell in cells:
            assert len(cell) == local_batch_size
            for row in cell:
                assert sum(lengths[i] for i in row) <= seq_len
                assert row == sorted(row)


@pytest.mark.parametrize("n, seq_len, b, dp", [(200, 2048, 2, 4), (7, 2048, 2, 4), (1, 64, 1, 1), (33, 256, 3, 2)])
def test_plan_rows_fills_the_grid_within_seq_len(n, seq_len, b, dp):
    rng = np.random.default_rng(n)
    lengths = rng.integers(1, seq_len + 1, n).tolist()
    grid = plan_rows(lengths, seq_len, b, dp)
    _check_grid(grid, lengths, seq_len, b, dp)
    assert len(grid) >= 1
    # never more micro-batches than one sample per row would need
    assert len(grid) <= -(-n // (b * dp))


def test_plan_rows_balances_each_cell_across_ranks():
    data = np.loadtxt(str(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt"), dtype=int)
    lengths = data[:512].tolist()
    grid = plan_rows(lengths, 4096, 2, 4)
    _check_grid(grid, lengths, 4096, 2, 4)
    work = calculate_workload(np.asarray(lengths))
    cells = np.array([[sum(int(work[row].sum()) for row in cell) for cell in cells] for cells in grid], dtype=float)
    efficiency = cells.sum() / 4 / cells.max(axis=1).sum()
    assert efficiency > 0.995, efficiency


def test_plan_rows_errors():
    with pytest.raises(ValueError, match=r"sample 1 needs 300 tokens, which exceeds seq_len=256 .* drops such samples"):
        plan_rows([10, 300], 256, 1, 1)
    with pytest.raises(ValueError, match="dp_degree must be a positive int, got 0"):
        plan_rows([10], 256, 1, 0)
    assert plan_rows([], 256, 2, 2) == [[[[], []], [[], []]]]


def test_install_without_torchtitan_says_so():
    if importlib.util.find_spec("torchtitan") is not None:
        pytest.skip("torchtitan is installed here: the missing-trainer error cannot be shown")
    with pytest.raises(ImportError, match=r"needs torchtitan's RL batcher \(tested with torchtitan 0.3.0\)"):
        seqbal_torchtitan.install()
    assert not seqbal_torchtitan.is_installed()


# ---------------------------------------------------------------------------------------------
# torchtitan 0.3.0's own Batcher
# ---------------------------------------------------------------------------------------------

STAND_INS = ("torchtitan.experiments", "torchtitan.experiments.rl")


@pytest.fixture(scope="module")
def batcher_module():
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (CI installs torchtitan==0.3.0 with --no-deps, see docs/torchtitan.md)")
    import torchtitan

    root = Path(torchtitan.__file__).parent / "experiments"
    before = set(sys.modules)
    for name, path in zip(STAND_INS, (root, root / "rl")):
        if name not in sys.modules:
            stand_in = types.ModuleType(name)
            stand_in.__path__ = [str(path)]
            sys.modules[name] = stand_in
    try:
        module = importlib.import_module(seqbal_torchtitan.BATCHER_MODULE)
    except ImportError as error:
        for name in set(sys.modules) - before:
            del sys.modules[name]
        pytest.skip(f"torchtitan's batcher.py does not import here: {error}")
    assert Path(module.__file__).resolve() == (root / "rl" / "components" / "batcher.py").resolve()
    assert not any(name.split(".")[0] in ("vllm", "triton") for name in sys.modules if name not in before)
    yield module
    seqbal_torchtitan.uninstall()
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _types():
    return importlib.import_module("torchtitan.experiments.rl.types")


def _group(group_id, lengths, first_id):
    """One rollout group: sample k's tokens all equal its id (>= 1; pad_id is 0)."""
    t = _types()
    samples = []
    for k, length in enumerate(lengths):
        sample_id = first_id + k
        samples.append(t.TrainingSample(
            min_policy_version=0, max_policy_version=0,
            rollout_id=t.RolloutTurnID(group_id=group_id, rollout_id=k, turn_id=0),
            token_ids=[sample_id] * (length + 1),  # the batcher drops one token: length to pack
            loss_mask=[True] * (length + 1), logprobs=[-1.0] * (length + 1), advantage=[1.0] * (length + 1),
        ))
    return t.TrainingSampleGroup(group_id=group_id, training_samples=samples, metrics=[])


def _step(module, lengths_per_group, *, seq_len, local_batch_size, dp_degree):
    batcher = module.Batcher.Config(batch=module.BatchConfig(local_batch_size=local_batch_size, seq_len=seq_len)).build(
        num_prompts_per_train_step=len(lengths_per_group), dp_degree=dp_degree, pad_id=0,
    )
    first, result = 1, None
    for g, lengths in enumerate(lengths_per_group):
        result = batcher.add_training_samples(training_sample_group=_group(g, lengths, first))
        first += len(lengths)
    assert result is not None
    return result


def _cells(batch, *, seq_len, local_batch_size, dp_degree):
    """Per (micro-batch, rank): the sample ids and their packed lengths, read from the tensors."""
    grid = []
    for cells in batch.microbatches:
        assert len(cells) == dp_degree
        row = []
        for cell in cells:
            assert tuple(cell.token_ids.shape) == (local_batch_size, seq_len)  # every row within seq_len
            ids, counts = np.unique(cell.token_ids.numpy(), return_counts=True)
            row.append({int(i): int(c) for i, c in zip(ids, counts) if i != 0})
        grid.append(row)
    return grid


def _lengths(seed, groups, per_group, high):
    rng = np.random.default_rng(seed)
    return [rng.integers(20, high, per_group).tolist() for _ in range(groups)]


@pytest.mark.parametrize("seed, seq_len, b, dp", [(0, 1024, 2, 4), (1, 2048, 1, 8), (2, 512, 4, 2)])
def test_batcher_packs_every_sample_within_seq_len_and_balances_cells(batcher_module, seed, seq_len, b, dp):
    groups = _lengths(seed, 16, 8, seq_len // 2)
    lengths = {i + 1: n for i, n in enumerate(x for g in groups for x in g)}
    shape = dict(seq_len=seq_len, local_batch_size=b, dp_degree=dp)
    theirs = _cells(_step(batcher_module, groups, **shape), **shape)
    with seqbal_torchtitan.installed(batcher_module.Batcher):
        ours = _cells(_step(batcher_module, groups, **shape), **shape)
    placed = {}
    for cells in ours:
        for cell in cells:
            for sample_id, count in cell.items():
                assert sample_id not in placed, f"sample {sample_id} packed twice"
                placed[sample_id] = count
    assert placed == lengths, "every sample that fits is packed once, whole"
    assert len(ours) <= len(theirs), "never more micro-batches than torchtitan's next-fit"

    def efficiency(grid):
        work = np.array([[sum(int(calculate_workload(np.array([n]))[0]) for n in cell.values()) for cell in cells]
                         for cells in grid], dtype=float)
        return work.sum() / dp / work.max(axis=1).sum()

    assert efficiency(ours) >= efficiency(theirs)
    assert efficiency(ours) > 0.98


def test_batcher_keeps_torchtitans_drop_of_oversized_samples(batcher_module):
    shape = dict(seq_len=256, local_batch_size=2, dp_degree=2)
    with seqbal_torchtitan.installed(batcher_module.Batcher):
        batch = _step(batcher_module, [[100, 400, 50], [30, 90]], **shape)
    ids = {i for cells in _cells(batch, **shape) for cell in cells for i in cell}
    assert ids == {1, 3, 4, 5}  # sample 2 (400 tokens > 256) dropped by torchtitan, the rest packed
    dropped = [metric for metric in batch.metrics if metric.key == "batcher/num_samples_dropped_oversized"]
    assert dropped, [metric.key for metric in batch.metrics]


def test_batcher_with_few_samples_pads_rows(batcher_module):
    shape = dict(seq_len=512, local_batch_size=2, dp_degree=4)
    with seqbal_torchtitan.installed(batcher_module.Batcher):
        batch = _step(batcher_module, [[100, 200, 300]], **shape)
    grid = _cells(batch, **shape)
    assert len(grid) == 1
    assert sorted(i for cells in grid for cell in cells for i in cell) == [1, 2, 3]


def test_install_and_uninstall_restore_exactly_what_was_there(batcher_module):
    cls = batcher_module.Batcher
    before = {name: cls.__dict__[name] for name in ("_assign_training_samples_to_rows", "_build_microbatch_grid")}
    assert seqbal_torchtitan.install(cls) == list(before)
    assert seqbal_torchtitan.is_installed()
    assert seqbal_torchtitan.install(cls) == list(before)  # idempotent
    assert all(cls.__dict__[name] is not original for name, original in before.items())
    with pytest.raises(ValueError, match="installed on"):
        seqbal_torchtitan.install(type("Other", (), dict(before)))
    assert seqbal_torchtitan.uninstall() == list(before)
    assert {name: cls.__dict__[name] for name in before} == before
    assert not seqbal_torchtitan.is_installed()
    assert seqbal_torchtitan.uninstall() == []
    # the context manager leaves the class as it found it
    with seqbal_torchtitan.installed(cls):
        assert seqbal_torchtitan.is_installed()
    assert {name: cls.__dict__[name] for name in before} == before


def test_install_imports_the_batcher_module_by_name(batcher_module):
    # with the module loaded (here through the stand-ins; in a trainer through torchtitan's own
    # package), install() finds the class itself
    assert seqbal_torchtitan.install() == ["_assign_training_samples_to_rows", "_build_microbatch_grid"]
    assert batcher_module.Batcher.__dict__["_build_microbatch_grid"] is not None
    seqbal_torchtitan.uninstall()
