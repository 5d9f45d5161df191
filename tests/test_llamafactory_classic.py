"""seqbal's token budget inside LLaMA-Factory's classic SFT trainer (``CustomSeq2SeqTrainer``),
through LLaMA-Factory's own entry point ``run_exp`` on CPU, on 1 rank and on 2 gloo ranks
(``python -m torch.distributed.run --standalone``); see ``tests/llamafactory_classic_workers.py``
for what each mode runs. ``examples/llamafactory_cpu`` (docs/llamafactory.md's CPU route: torchaudio's stand-in) goes on
``PYTHONPATH`` of every LLaMA-Factory process.

The real runs are skipped without llamafactory (CI installs llamafactory 0.9.5 and its pins in
an environment of their own); the argument checks at the top run everywhere. Every launch has a
hard deadline: the launcher's whole session is killed and the test fails past ``DEADLINE_S``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from . import llamafactory_classic_workers as workers
from .deadline import run_with_deadline

ROOT = Path(__file__).resolve().parent.parent
SHIMS = ROOT / "examples" / "llamafactory_cpu"
DEADLINE_S = 240


# --- without llamafactory -------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, name", [
    ({"max_token_len": 0}, "max_token_len"),
    ({"max_token_len": True}, "max_token_len"),
    ({"max_token_len": 64, "max_samples_per_micro_batch": 0}, "max_samples_per_micro_batch"),
    ({"max_token_len": 64, "cost_model": "no such cost"}, "cost_model"),
    ({"max_token_len": 64, "micro_batch_order": "smallest_first"}, "micro_batch_order .* got 'smallest_first'"),
])
def test_install_checks_its_arguments_before_importing_anything(kwargs, name):
    from seqbal.integrations import _llamafactory_classic as classic

    with pytest.raises(ValueError, match=name):
        classic.install(**kwargs)
    assert not classic.is_installed()


def test_default_cost_is_the_collators_padding():
    from seqbal import CostModel
    from seqbal.integrations._llamafactory_classic import _default_cost, _length_advice

    class Collator:  # LLaMA-Factory's SFT collator pads to a multiple of 8 when training
        pad_to_multiple_of = 8

    cost = _default_cost(Collator())
    assert cost == CostModel(padded=True, round_to=8)
    assert cost.cost([9, 3]) == 2 * 16  # what the padded tensor holds
    assert _default_cost(object()) == CostModel(padded=True)
    assert "cutoff_len <= 96" in _length_advice(cost, 100)


def test_the_default_cap_is_llamafactorys_own_largest_micro_batch():
    from types import SimpleNamespace

    from seqbal import CostModel
    from seqbal.integrations._llamafactory_classic import _own_largest_micro_batch

    args = SimpleNamespace(per_device_train_batch_size=2)
    assert _own_largest_micro_batch(args, [9, 30, 4], CostModel(padded=True, round_to=8)) == 2 * 32
    assert _own_largest_micro_batch(args, [9, 30, 4], None) == 2 * 30


def test_settings_seqbal_cannot_serve_are_errors_naming_them():
    from types import SimpleNamespace

    from seqbal.integrations import _llamafactory_classic as classic

    plain = SimpleNamespace(accelerator=SimpleNamespace(dispatch_batches=None, split_batches=False))
    classic._check_trainer(plain, object())  # LLaMA-Factory's defaults: nothing to say
    for name in ("dispatch_batches", "split_batches"):
        trainer = SimpleNamespace(accelerator=SimpleNamespace(**{"dispatch_batches": False, "split_batches": False,
                                                                 name: True}))
        with pytest.raises(ValueError, match=name):
            classic._check_trainer(trainer, object())
    class Mesh:  # torch's DeviceMesh as accelerate reads it: named dimensions with sizes
        mesh_dim_names = ("dp_shard", "tp")

        def __getitem__(self, name):
            return SimpleNamespace(size=lambda: 2)

    meshed = SimpleNamespace(accelerator=SimpleNamespace(dispatch_batches=None, split_batches=False,
                                                         torch_device_mesh=Mesh()))
    with pytest.raises(ValueError, match="tp=2"):
        classic._check_trainer(meshed, object())
    flash = SimpleNamespace(neat_packing=True, attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="max_samples_per_micro_batch=1"):
        classic._check_trainer(plain, flash)
    classic._settings["max_samples_per_micro_batch"] = 1
    try:
        classic._check_trainer(plain, flash)  # one packed row per micro-batch: what its collator takes
    finally:
        classic._settings.clear()


# --- a real LLaMA-Factory SFT run -----------------------------------------------------------


@pytest.fixture
def llamafactory():
    """Skips without llamafactory and transformers; imports neither's trainer here (the runs do,
    in their own processes)."""
    pytest.importorskip("llamafactory")
    pytest.importorskip("transformers")


def import_sft_trainer(monkeypatch):
    """LLaMA-Factory's SFT trainer module, imported in this process (a few seconds)."""
    monkeypatch.syspath_prepend(str(SHIMS))  # torchaudio's stand-in, if no torchaudio is loaded yet
    import llamafactory.train.sft.trainer as module

    return module


def launch(mode: str, world: int, tmp_path: Path, resume_step: "int | None" = None) -> list[dict]:
    out = tmp_path / f"{mode}-{world}"
    out.mkdir(exist_ok=resume_step is not None)
    script = str(ROOT / "tests" / "llamafactory_classic_workers.py")
    arguments = [script, mode, "--out", str(out)]
    if resume_step is not None:
        arguments += ["--resume-step", str(resume_step)]
    if world == 1:
        command = [sys.executable, *arguments]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                   *arguments]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SHIMS), str(ROOT)]), OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.pop("DISABLE_VERSION_CHECK", None)  # LLaMA-Factory checks its own pins: they hold
    done = run_with_deadline(command, deadline_s=DEADLINE_S, cwd=str(ROOT), env=env, what=f"{mode} on {world} rank(s)")
    name = "rank" if resume_step is None else "resumed"
    records = [out / f"{name}{rank}.json" for rank in range(world)]
    missing = [str(path) for path in records if not path.exists()]
    assert not missing, f"exit {done.returncode}, no record {missing}: {done.stderr[-3000:]}"
    return [json.loads(path.read_text()) for path in records]


def sample_of(row: list[int]) -> int:
    """The sample a forwarded row is: the worker starts row ``i`` with the token ``4 + i``."""
    return row[0] - 4


@pytest.mark.parametrize("world", [1, 2])
def test_sft_run_under_the_token_budget(llamafactory, world, tmp_path):
    records = launch("budget", world, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    assert all(r["sampler"] == "LlamaFactoryTokenBudgetBatchSampler" for r in records)
    length = records[0]["len"]
    assert all(r["len"] == length for r in records) and length % workers.GA == 0
    assert all(r["global_step"] == workers.EPOCHS * length // workers.GA for r in records)
    rows = records[0]["rows"]
    assert all(r["rows"] == rows for r in records)  # the ranks agree on their inputs
    for r in records:
        assert len(r["warnings"]) == 1 and "per_device_train_batch_size" in r["warnings"][0]
        assert len(r["forwards"]) == workers.EPOCHS * length  # the same forwards on every rank
        for forward in r["forwards"]:
            rows_count, padded_len = forward["shape"]
            # the padded cost: rows x the batch's longest row, rounded up to 8 by LLaMA-Factory's collator
            assert rows_count * padded_len <= workers.CAP, forward["shape"]
            assert padded_len == -(-max(map(len, forward["rows"])) // 8) * 8
    assert any(len(f["rows"]) > 2 for r in records for f in r["forwards"])  # per_device_train_batch_size=2 no longer limits
    for epoch in range(workers.EPOCHS):
        plan = records[0]["plans"][epoch]
        assert all(r["plans"][epoch] == plan for r in records)
        trained = []
        for r in records:
            forwards = r["forwards"][epoch * length:(epoch + 1) * length]
            # what rank r forwards is its own share of the plan, in order: accelerate did not reshard it
            assert [[rows[i] for i in mb] for mb in plan[r["rank"]]] == [f["rows"] for f in forwards]
            trained += [sample_of(row) for f in forwards for row in f["rows"]]
        assert sorted(trained) == list(range(workers.SAMPLES))  # every sample exactly once per epoch
    assert records[0]["plans"][0] != records[0]["plans"][1]  # a fresh shuffle every epoch


@pytest.mark.parametrize("world", [1, 2])
def test_largest_first_runs_every_steps_largest_padded_batch_first(llamafactory, world, tmp_path):
    records = launch("largest", world, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    length = records[0]["len"]
    for epoch in range(workers.EPOCHS):  # every step: the same micro-batches, reordered
        plan, drawn = records[0]["plans"][epoch], records[0]["unordered_plans"][epoch]
        assert all(r["plans"][epoch] == plan for r in records)
        for start in range(0, length, workers.GA):
            for ordered, as_drawn in zip(plan, drawn):
                assert sorted(ordered[start:start + workers.GA]) == sorted(as_drawn[start:start + workers.GA])
    assert records[0]["plans"] != records[0]["unordered_plans"]  # the order has teeth here
    sizes = [[f["shape"][0] * f["shape"][1] for f in r["forwards"]] for r in records]  # rows x padded length
    assert all(len(s) == workers.EPOCHS * length for s in sizes)
    for start in range(0, workers.EPOCHS * length, workers.GA):  # as forwarded, both epochs
        slot_largest = [max(s[i] for s in sizes) for i in range(start, start + workers.GA)]
        assert slot_largest == sorted(slot_largest, reverse=True), (start, slot_largest)


def test_neat_packing_rows_are_samples_under_the_budget(llamafactory, tmp_path):
    (r,) = launch("packed", 1, tmp_path)
    assert "error" not in r, r.get("error")
    assert r["sampler"] == "LlamaFactoryTokenBudgetBatchSampler"
    # LLaMA-Factory packs samples into rows padded to cutoff_len; seqbal plans those rows
    assert set(map(len, r["rows"])) == {workers.PACKED_CUTOFF}
    assert len(r["forwards"]) == r["len"] == r["global_step"] * workers.GA
    per_batch = workers.CAP // workers.PACKED_CUTOFF
    assert sum(f["shape"][0] for f in r["forwards"]) == len(r["rows"])  # every packed row once
    assert all(f["shape"] == [per_batch, workers.PACKED_CUTOFF] for f in r["forwards"][:-1]), r["forwards"]
    assert all(f["shape"][0] * f["shape"][1] <= workers.CAP for f in r["forwards"])


def test_an_over_long_sample_is_an_error_on_every_rank(llamafactory, tmp_path):
    records = launch("overcap", 2, tmp_path)
    for r in records:
        assert "forwards" in r and not r["forwards"]  # nothing trained
        message = r.get("error", "")
        assert f"has {workers.LONG} tokens" in message and f"max_token_len={workers.CAP}" in message, message
        assert "cutoff_len" in message
    assert records[0]["error"] == records[1]["error"]


def test_uninstalled_llamafactory_keeps_its_own_sampler_and_trains_the_long_sample(llamafactory, tmp_path):
    (r,) = launch("plain", 1, tmp_path)
    assert "error" not in r, r.get("error")
    assert r["sampler"] == "BatchSampler" and not r["warnings"]
    assert all(len(f["rows"]) <= 2 for f in r["forwards"])  # per_device_train_batch_size
    long = [f for f in r["forwards"] if any(len(row) == workers.LONG for row in f["rows"])]
    # LLaMA-Factory keeps a sample up to cutoff_len whole, with no token cap: the forward is over it
    assert len(long) == 1 and long[0]["shape"][0] * long[0]["shape"][1] > workers.CAP
    assert sorted(sample_of(row) for f in r["forwards"] for row in f["rows"]) == list(range(workers.SAMPLES))


def test_a_run_resumed_mid_epoch_trains_exactly_the_rest(llamafactory, tmp_path):
    full = launch("resume", 2, tmp_path)
    length = full[0]["len"]
    step = length // workers.GA + 1  # one optimizer step into epoch 1: transformers skips GA batches of it
    resumed = launch("resume", 2, tmp_path, resume_step=step)
    for before, after in zip(full, resumed):
        assert "error" not in before and "error" not in after, (before.get("error"), after.get("error"))
        assert after["global_step"] == before["global_step"] == workers.EPOCHS * length // workers.GA
        # the same batches as the uninterrupted run from that point, on every rank (epoch 1's shuffle,
        # not epoch 0's: accelerate's skip and shard wrappers do not forward set_epoch)
        assert after["forwards"] == before["forwards"][step * workers.GA:]


def test_install_and_uninstall_restore_only_what_seqbal_bound(llamafactory, monkeypatch):
    sft = import_sft_trainer(monkeypatch)
    from transformers.trainer import Trainer

    from seqbal.integrations import _llamafactory_classic as classic

    own = vars(Trainer)["get_train_dataloader"]
    assert classic.install(64) == [("Trainer", "get_train_dataloader")]
    try:
        assert classic.is_installed() and vars(Trainer)["get_train_dataloader"] is not own
        classic.install(32, max_samples_per_micro_batch=3)  # idempotent: the new settings, the same patch
        assert classic._settings["max_token_len"] == 32 and len(classic._patches) == 1
        assert sft.CustomSeq2SeqTrainer.get_train_dataloader is vars(Trainer)["get_train_dataloader"]
    finally:
        assert classic.uninstall() == [("Trainer", "get_train_dataloader")]
    assert vars(Trainer)["get_train_dataloader"] is own and not classic.is_installed()
    assert classic.uninstall() == []

    classic.install(64)
    def theirs(self):  # someone else's method bound after seqbal's
        return None

    Trainer.get_train_dataloader = theirs
    try:
        assert classic.uninstall() == []  # seqbal's is no longer bound: nothing restored
        assert vars(Trainer)["get_train_dataloader"] is theirs
    finally:
        Trainer.get_train_dataloader = own
