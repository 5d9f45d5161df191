"""seqbal's token budget inside a real transformers ``Trainer`` and TRL ``SFTTrainer`` (CPU, a
tiny Llama built from a config), on 1 rank and on 2 gloo ranks through
``python -m torch.distributed.run``; see ``tests/trl_workers.py`` for what each mode runs.

Skipped without trl and transformers 5.24 (CI installs them in their own environment). Every
launch has a hard deadline: the launcher is killed and the test fails past ``DEADLINE_S``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
if not hasattr(pytest.importorskip("transformers.trainer_pt_utils"), "BatchRebalanceSampler"):
    pytest.skip("needs transformers >= 5.24.0", allow_module_level=True)

import torch  # noqa: E402

from . import trl_workers as workers  # noqa: E402
from .deadline import run_with_deadline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 240
GA = 2


def launch(mode: str, world: int, tmp_path: Path) -> list[dict]:
    out = tmp_path / f"{mode}-{world}"
    out.mkdir()
    script = str(ROOT / "tests" / "trl_workers.py")
    if world == 1:
        command = [sys.executable, script, mode, "--out", str(out)]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                   script, mode, "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = run_with_deadline(command, deadline_s=DEADLINE_S, cwd=str(ROOT), env=env, what=f"{mode} on {world} rank(s)")
    records = [out / f"rank{rank}.json" for rank in range(world)]
    missing = [str(path) for path in records if not path.exists()]
    assert not missing, f"exit {done.returncode}, no record {missing}: {done.stderr[-3000:]}"
    return [json.loads(path.read_text()) for path in records]


def check_training(records: list[dict], cost: str) -> None:
    world = len(records)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    assert all(r["sampler"] == "TrainerTokenBudgetBatchSampler" for r in records)
    assert len({r["len"] for r in records}) == 1 and records[0]["len"] % GA == 0
    assert len({r["global_step"] for r in records}) == 1
    assert records[0]["global_step"] == 2 * records[0]["len"] // GA  # 2 epochs, every step GA micro-batches
    for r in records:
        assert len(r["forwards"]) == 2 * r["len"]  # every micro-batch forwarded once per epoch
        assert max(r["forwards"]) <= workers.CAP, (cost, max(r["forwards"]))
        assert r["losses"][-1] < 0.5 * r["losses"][0]
        assert len(r["warnings"]) == 1 and "per_device_train_batch_size" in r["warnings"][0]
    plan = records[0]["plan"]
    assert all(r["plan"] == plan for r in records) and len(plan) == world
    seen = sorted(i for rank in plan for mb in rank for i in mb)
    assert seen == list(range(160))  # every sample exactly once per epoch


@pytest.mark.parametrize("world", [1, 2])
def test_sft_trainer_under_the_cap(world, tmp_path):
    check_training(launch("sft", world, tmp_path), "tokens")


def test_sft_trainer_under_both_caps_two_ranks(tmp_path):
    records = launch("samplecap", 2, tmp_path)
    check_training(records, "tokens")
    for r in records:
        assert max(r["sequences"]) <= workers.MAX_SAMPLES, r["sequences"]
        assert all(len(mb) <= workers.MAX_SAMPLES for rank in r["plan"] for mb in rank)
    unlimited = max(len(mb) for rank in launch("sft", 2, tmp_path)[0]["plan"] for mb in rank)
    assert unlimited > workers.MAX_SAMPLES  # without the sample cap the token cap alone packs more: the test has teeth


@pytest.mark.parametrize("world", [1, 2])
def test_largest_first_runs_every_steps_largest_micro_batch_first(world, tmp_path):
    records = launch("largest", world, tmp_path)
    check_training(records, "tokens")
    for r in records:  # the same micro-batches in every optimizer step, only reordered
        for start in range(0, r["len"], GA):
            for ordered, drawn in zip(r["plan"], r["unordered_plan"]):
                assert sorted(ordered[start:start + GA]) == sorted(drawn[start:start + GA])
    assert any(r["plan"] != r["unordered_plan"] for r in records)  # the order has teeth here
    for start in range(0, len(records[0]["forwards"]), GA):  # both epochs, as forwarded
        slot_largest = [max(r["forwards"][i] for r in records) for i in range(start, start + GA)]
        assert slot_largest == sorted(slot_largest, reverse=True), (start, slot_largest)
        if world == 1:
            window = records[0]["forwards"][start:start + GA]
            assert window == sorted(window, reverse=True)


def test_ranks_that_install_different_orders_all_refuse(tmp_path):
    errors = [r.get("error", "") for r in launch("orders_differ", 2, tmp_path)]
    for error in errors:  # the agreed error (each rank names its own value)
        assert "the ranks passed different settings" in error and "micro_batch_order (" in error, errors


def test_plain_trainer_padded_cost_two_ranks(tmp_path):
    check_training(launch("trainer", 2, tmp_path), "padded")


@pytest.mark.parametrize("world", [1, 2])
def test_one_step_is_the_gradient_of_the_full_batch_token_mean(world, tmp_path):
    records = launch("exact", world, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    rows = records[0]["rows"]
    step = sorted(i for r in records for mb in r["plan"][r["rank"]][:GA] for i in mb)
    model = workers.tiny_model(torch.float64)
    total, count = 0, 0
    for index in step:  # one forward per sample: no packing, no accumulation
        ids = torch.tensor([rows[index]])
        logits = model(input_ids=ids).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
        count += ids.shape[1] - 1
    (total / count).backward()
    assert len(step) < len(rows)  # the step is a strict, variable part of the dataset
    for name, parameter in model.named_parameters():
        for r in records:
            delta = torch.tensor(r["delta"][name], dtype=torch.float64)  # lr 1 SGD: the gradient
            assert torch.allclose(delta, parameter.grad, rtol=0, atol=1e-9), (name, float((delta - parameter.grad).abs().max()))


@pytest.mark.parametrize("world", [1, 2])
def test_resuming_mid_epoch_gives_the_remaining_batches(world, tmp_path):
    """A run resumed one step into epoch 1, or into epoch 2, forwards exactly what the
    uninterrupted run forwarded from that step on, rank by rank (accelerate's shard and skip
    wrappers do not forward set_epoch; the sampler must still be in the resumed epoch). On
    transformers 5.25 the skip goes through ``Trainer.get_resumed_dataloader``."""
    records = launch("resume", world, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    for r in records:
        per_epoch = r["steps_per_epoch"] * GA
        full = r["full"]
        assert per_epoch >= 2 * GA and len(full) == 3 * per_epoch
        epochs = [full[e * per_epoch:(e + 1) * per_epoch] for e in range(3)]
        assert epochs[0] != epochs[1] != epochs[2] != epochs[0]  # every epoch reshuffled: the check has teeth
        assert [resume["epoch"] for resume in r["resumes"]] == [1, 2]
        for resume in r["resumes"]:
            assert resume["global_step"] == 3 * r["steps_per_epoch"]
            assert resume["forwarded"] == full[resume["step"] * GA:], (r["rank"], resume["epoch"])
            # transformers skips one optimizer step's micro-batches of the resumed epoch
            assert resume["skipped"] == ([GA] if r["has_resumed_dataloader"] else [])
    assert r["has_resumed_dataloader"] == hasattr(transformers.Trainer, "get_resumed_dataloader")
    assert world == 1 or records[0]["full"] != records[1]["full"]  # each rank its own micro-batches


@pytest.mark.parametrize("world", [1, 2])
def test_packed_sequences_that_would_attend_to_each_other_stop_training(world, tmp_path):
    """The first training batch of a padding-free run raises on every rank exactly where
    transformers would let the packed sequences attend to each other (the ground truth: the
    first batch's packed logits against one forward per sequence, with the same arguments and
    model state), with and without gradient checkpointing, in a plain Trainer and SFTTrainer."""
    records = launch("guard", world, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    for r in records:
        assert [c["case"] for c in r["cases"]] == [list(case) for case in workers.GUARD_CASES]
        for case in r["cases"]:
            crossed = case["logit_error"] > 1e-3
            assert crossed or case["logit_error"] < 1e-5, case  # clearly one or the other
            assert (case["error"] is not None) == crossed, case
            if crossed:
                assert "would attend to each other" in case["error"] and "use_cache" in case["error"], case
                assert case["global_step"] == 0, case  # raised before the first update
            else:
                assert case["global_step"] == 1, case
        kinds = {tuple(c["case"]): c for c in r["cases"]}
        assert kinds[("trainer", True, False, "sdpa")]["error"] is not None  # the test has teeth
        assert kinds[("sft", True, False, "sdpa")]["first_use_cache"] is False  # SFTTrainer's own use_cache=False


def test_an_over_cap_sample_is_an_error_on_every_rank(tmp_path):
    records = launch("overcap", 2, tmp_path)
    for r in records:
        assert "exceeds max_token_len=96" in r.get("error", ""), r
        assert f"{workers.CAP + 5} tokens" in r["error"]


def documented(info_word: str, language: str = "python") -> list[tuple[str, int]]:
    """(code, line) of docs/trl.md's blocks in ``language`` whose info string has ``info_word``."""
    from .test_docs import blocks

    return [(code, line) for info, code, line in blocks(ROOT / "docs" / "trl.md")
            if info.split()[:1] == [language] and (not info_word or info_word in info.split())]


def run_documented(command: list[str], what: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1")  # nothing may be downloaded
    done = run_with_deadline(command, deadline_s=DEADLINE_S, cwd=str(ROOT), env=env, what=what)
    assert done.returncode == 0, f"{what}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout


def example_commands() -> list[list[str]]:
    """The example's commands as docs/trl.md writes them (torchrun through this interpreter, on a
    free port)."""
    commands = []
    for code, _ in documented("", "bash"):
        for line in code.splitlines():
            words = line.split(" #")[0].split()
            if words[:2] == ["python", "examples/trl_sft.py"]:
                commands.append([sys.executable] + words[1:])
            elif words[:1] == ["torchrun"]:
                commands.append([sys.executable, "-m", "torch.distributed.run", "--standalone"] + words[1:])
    return commands


ROW = re.compile(r"^(trl|seqbal)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+) -> ([\d.]+)$", re.M)


@pytest.mark.parametrize("world", [1, 2])
def test_the_documented_example_runs_as_written(world):
    """docs/trl.md's recipe, ``examples/trl_sft.py``, on 1 and 2 ranks: seqbal keeps every
    forward within the cap with the same forwards on every rank; TRL's own batching, sized for
    the mean, does not (the example shows a real difference)."""
    commands = example_commands()
    assert len(commands) == 2, commands
    command = [c for c in commands if (f"--nproc_per_node={world}" in c) == (world > 1)][0]
    out = run_documented(command, f"the example on {world} rank(s)")
    assert "check: OK" in out
    cap = int(re.search(r"cap (\d+) tokens per forward", out).group(1))
    rows = [m.groups() for m in ROW.finditer(out)]
    assert [(r[0], int(r[1])) for r in rows] == [(route, rank) for route in ("trl", "seqbal") for rank in range(world)]
    by_route = {route: [r for r in rows if r[0] == route] for route in ("trl", "seqbal")}
    for route, ranks in by_route.items():
        for _, _, forwards, samples, mean, largest, cap_shown, over, first, last in ranks:
            assert int(cap_shown) == cap and float(last) < float(first), (route, first, last)
            assert float(mean) <= int(largest)
    seqbal = by_route["seqbal"]
    assert all(int(r[5]) <= cap and int(r[7]) == 0 for r in seqbal)
    assert len({r[2] for r in seqbal}) == 1 and sum(int(r[3]) for r in seqbal) == 256
    assert sum(int(r[7]) for r in by_route["trl"]) > 0  # TRL's sample count does exceed the cap here


def test_the_pages_trl_blocks_run_as_written():
    """The python blocks of docs/trl.md that need TRL (``needs-trl``; tests/test_docs.py only
    compiles them), each on its own in a fresh interpreter, from the checkout's root."""
    found = documented("needs-trl")
    assert len(found) >= 2
    for code, line in found:
        run_documented([sys.executable, "-c", code], f"docs/trl.md:{line}")


def test_install_uninstall_restores_only_its_own_patch():
    import seqbal.integrations.trl as seqbal_trl
    from transformers import Trainer

    original = vars(Trainer)["_get_train_sampler"]
    assert seqbal_trl.install(64) == [("Trainer", "_get_train_sampler")] and seqbal_trl.is_installed()
    assert seqbal_trl.install(128) == []  # idempotent, the cap changes
    assert seqbal_trl.uninstall() == [("Trainer", "_get_train_sampler")] and not seqbal_trl.is_installed()
    assert vars(Trainer)["_get_train_sampler"] is original
    with seqbal_trl.installed(64):
        assert vars(Trainer)["_get_train_sampler"] is not original
        theirs = lambda self, train_dataset=None: None  # noqa: E731 - someone patches after install
        Trainer._get_train_sampler = theirs
    assert vars(Trainer)["_get_train_sampler"] is theirs  # left alone
    Trainer._get_train_sampler = original
    with pytest.raises(ValueError, match="max_token_len must be a positive int"):
        seqbal_trl.install(0)
    with pytest.raises(ValueError, match="max_samples_per_micro_batch must be a positive int"):
        seqbal_trl.install(64, max_samples_per_micro_batch=0)
    assert not seqbal_trl.is_installed()


def test_install_takes_numpy_integers_and_names_the_callers_arguments():
    import numpy as np

    import seqbal.integrations.trl as seqbal_trl
    from seqbal.integrations.trl import _settings

    try:
        seqbal_trl.install(np.int64(8192), max_samples_per_micro_batch=np.int32(4))
        assert _settings["max_token_len"] == 8192 and type(_settings["max_token_len"]) is int
        assert _settings["max_samples_per_micro_batch"] == 4 and type(_settings["max_samples_per_micro_batch"]) is int
    finally:
        seqbal_trl.uninstall()
    for bad, name in [(True, "max_token_len"), (np.bool_(True), "max_token_len"), (np.int64(0), "max_token_len"),
                      (8192.0, "max_token_len"), ("8192", "max_token_len")]:
        with pytest.raises(ValueError, match=f"^{name} must be a positive int, got"):
            seqbal_trl.install(bad)
    with pytest.raises(ValueError, match="^max_samples_per_micro_batch must be a positive int"):
        seqbal_trl.install(64, max_samples_per_micro_batch=np.float64(2))
    with pytest.raises(ValueError, match="^cost_model must be"):
        seqbal_trl.install(64, cost_model="quadratic")
    assert not seqbal_trl.is_installed()


def test_what_install_says_about_trls_length_settings():
    """Where seqbal can see TRL's settings (the first dataloader), it says what to change: a
    packed row over the cap names SFTConfig.max_length, max_length=None names the samples to
    drop, and a padded SFTTrainer hears that padding_free needs max_length=None."""
    from types import SimpleNamespace

    from seqbal.integrations.trl import _first_dataloader_warning, _settings, _trl_length_advice

    packed = SimpleNamespace(padding_free=True, packing=True, max_length=1024)
    assert "SFTConfig.max_length=1024" in _trl_length_advice(packed, 512)
    assert _trl_length_advice(packed, 2048) == ""  # rows fit: the error is about something else
    free = SimpleNamespace(padding_free=True, packing=False, max_length=None)
    assert "max_length=None) truncates nothing" in _trl_length_advice(free, 512)
    assert _trl_length_advice(SimpleNamespace(max_length=None), 512) == ""  # a plain Trainer: nothing about TRL
    _settings["max_token_len"] = 512
    try:
        padded = SimpleNamespace(per_device_train_batch_size=8, padding_free=False, packing=False, max_length=1024)
        assert "padding_free=True, max_length=None" in _first_dataloader_warning(padded, "padded")
        unpadded = SimpleNamespace(per_device_train_batch_size=8, padding_free=True, packing=False, max_length=None)
        assert "padding_free" not in _first_dataloader_warning(unpadded, None)
    finally:
        _settings.clear()
