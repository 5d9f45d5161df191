"""seqbal in LLaMA-Factory 0.9.5's new trainer (``seqbal.integrations.llamafactory``): its own
``BatchGenerator`` and ``SFTTrainer`` on 1 and 2 gloo ranks, under hard deadlines.

Runs where LLaMA-Factory is installed (its own CI environment); elsewhere only the tests that
need no LLaMA-Factory run. ``examples/llamafactory_cpu`` (docs/llamafactory.md's CPU route) goes on ``PYTHONPATH`` of every
LLaMA-Factory process: it stands in for torchaudio (a CUDA build on the package index) and
makes ``torch.accelerator.synchronize`` a no-op where there is no accelerator.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections import Counter

import pytest

import seqbal.integrations.llamafactory as seqbal_llamafactory
from tests.deadline import run_with_deadline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIMS = os.path.join(ROOT, "examples", "llamafactory_cpu")
#: One torchrun of a few ranks (start, imports, the scenario); a healthy run takes 10-40 s.
DEADLINE_S = 300.0

needs_llamafactory = pytest.mark.skipif(importlib.util.find_spec("llamafactory") is None,
                                        reason="LLaMA-Factory is not installed (its own CI environment)")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SHIMS, ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _torchrun(ranks: int, *args: str, what: str):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *args]
    return run_with_deadline(command, deadline_s=DEADLINE_S, cwd=ROOT, env=_env(), what=what)


def _records(tmp_path, ranks: int, scenario: str) -> list[dict]:
    result = _torchrun(ranks, "tests/llamafactory_workers.py", scenario, str(tmp_path),
                       what=f"LLaMA-Factory's BatchGenerator ({scenario}) on {ranks} ranks")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]


# -- without LLaMA-Factory ----------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("llamafactory") is not None, reason="LLaMA-Factory is installed")
def test_install_without_llamafactory_says_what_it_needs():
    with pytest.raises(ImportError, match="seqbal.integrations.llamafactory needs .*llamafactory 0.9.5"):
        seqbal_llamafactory.install()
    assert not seqbal_llamafactory.is_installed()


@pytest.mark.parametrize("kwargs, name", [({"max_token_len": 0}, "max_token_len"),
                                          ({"max_token_len": 2.5}, "max_token_len"),
                                          ({"max_samples_per_micro_batch": -1}, "max_samples_per_micro_batch"),
                                          ({"cost_model": "quadratic"}, "cost_model")])
def test_install_names_a_bad_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        seqbal_llamafactory.install(**kwargs)
    assert not seqbal_llamafactory.is_installed()


# -- LLaMA-Factory's own BatchGenerator ---------------------------------------------------------

@needs_llamafactory
def test_install_and_uninstall_swap_only_the_two_dynamic_strategies_and_the_classic_dataloader(monkeypatch):
    monkeypatch.syspath_prepend(SHIMS)  # torchaudio's stand-in, for the classic trainer's imports
    from llamafactory.v1.plugins.trainer_plugins.batching import BatchingPlugin

    registry = BatchingPlugin._registry
    before = {name: dict(methods) for name, methods in registry.items()}
    changed = seqbal_llamafactory.install(4096)
    try:
        assert sorted(changed) == sorted([(f"BatchingPlugin({s!r})", m) for s in seqbal_llamafactory.STRATEGIES
                                          for m in ("fill_buffer", "generate_batch")]
                                         + [("Trainer", "get_train_dataloader")])  # the classic trainer's
        assert seqbal_llamafactory.install(2048) == []  # idempotent: only the cap changed
        for name, methods in registry.items():
            for method, function in methods.items():
                swapped = name in seqbal_llamafactory.STRATEGIES and method in ("fill_buffer", "generate_batch")
                assert (function is before[name][method]) != swapped, (name, method)
    finally:
        restored = seqbal_llamafactory.uninstall()
    assert sorted(restored) == sorted(changed)
    assert {name: dict(methods) for name, methods in registry.items()} == before
    assert seqbal_llamafactory.uninstall() == [] and not seqbal_llamafactory.is_installed()


@needs_llamafactory
@pytest.mark.parametrize("ranks", [1, 2])
def test_batch_generator_steps_are_capped_equal_and_lose_nothing(tmp_path, ranks):
    from tests.llamafactory_workers import CAP, NUM_MICRO_BATCH, STEPS, lengths

    records = _records(tmp_path, ranks, "steps")
    sizes = lengths(overlong=False)
    for strategy in seqbal_llamafactory.STRATEGIES:
        seen: Counter = Counter()
        for step in range(STEPS):
            for record in records:
                micro_batches = record[strategy][step]
                assert len(micro_batches) == NUM_MICRO_BATCH  # exactly num_micro_batch, every rank, every step
                for mb in micro_batches:
                    assert mb["samples"], "no empty micro-batch"
                    assert mb["lengths"] == [sizes[i] for i in mb["samples"]]  # never truncated
                    if strategy == "dynamic_batching":
                        rows, width = mb["shape"]
                        assert rows * width <= CAP and width == max(mb["lengths"])  # padded cost within the cap
                    else:
                        assert sum(mb["lengths"]) <= CAP and mb["shape"] == [1, sum(mb["lengths"])]
                    seen.update(mb["samples"])
        # the data provider restarts when it runs out, as LLaMA-Factory's own strategies do: within
        # one pass over the data no sample comes twice before every sample came once
        assert max(seen.values()) - min(seen.get(i, 0) for i in range(len(sizes))) <= 1, strategy
        per_step = [sum(sum(mb["lengths"]) for r in records for mb in r[strategy][s]) for s in range(STEPS)]
        capacity = NUM_MICRO_BATCH * ranks * CAP
        if strategy == "dynamic_padding_free":  # packed: a step fills most of its token capacity
            assert min(per_step) >= 0.75 * capacity, per_step
    for record in records:  # a checkpoint resumes exactly
        assert record["resumed"] == record["uninterrupted"]


@needs_llamafactory
def test_an_overlong_sample_on_one_rank_is_an_error_on_every_rank(tmp_path):
    from tests.llamafactory_workers import CAP

    records = _records(tmp_path, 2, "overlong")
    for record in records:
        message = record["error"]
        assert message is not None, f"rank {record['rank']} trained on"
        assert "rank 1 read has" in message and f"{CAP + 3} tokens" in message
        assert f"exceeds max_token_len {CAP}" in message


@needs_llamafactory
def test_ranks_installed_with_different_caps_all_raise(tmp_path):
    from tests.llamafactory_workers import CAP

    records = _records(tmp_path, 2, "mismatch")
    for record in records:
        message = record["error"]
        assert message is not None, f"rank {record['rank']} trained on"
        assert f"rank 0 has max_token_len={CAP}, rank 1 has {CAP + 8}" in message


# -- LLaMA-Factory's own SFTTrainer: the documented example ------------------------------------

def _page_commands() -> dict[int, tuple[list[str], str]]:
    """docs/llamafactory.md's example commands as written, by rank count: (argv through this
    interpreter, the ``PYTHONPATH=`` the line sets)."""
    from tests.test_docs import blocks
    from pathlib import Path

    commands = {}
    for info, code, _ in blocks(Path(ROOT) / "docs" / "llamafactory.md"):
        for line in code.splitlines() if info.split()[:1] == ["bash"] else []:
            words = line.split(" #")[0].split()
            path = words.pop(0).split("=", 1)[1] if words and words[0].startswith("PYTHONPATH=") else ""
            if words[:2] == ["python", "examples/llamafactory_sft.py"]:
                commands[1] = ([sys.executable] + words[1:], path)
            elif words[:1] == ["torchrun"] and "examples/llamafactory_sft.py" in words:
                ranks = int(re.search(r"--nproc_per_node=(\d+)", line).group(1))
                commands[ranks] = ([sys.executable, "-m", "torch.distributed.run"] + words[1:], path)
    return commands


@needs_llamafactory
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_example_trains_under_the_budget(ranks):
    """The page's commands as written, its CPU route's PYTHONPATH included."""
    command, path = _page_commands()[ranks]
    assert path == "examples/llamafactory_cpu"
    env = dict(_env(), PYTHONPATH=os.pathsep.join([os.path.join(ROOT, path), ROOT]))
    result = run_with_deadline(command, deadline_s=DEADLINE_S, cwd=ROOT, env=env,
                               what=f"docs/llamafactory.md's example on {ranks} rank(s)")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "check: OK" in result.stdout
    assert f"on {ranks} rank(s)" in result.stdout


@needs_llamafactory
def test_the_documented_launcher_trains_from_a_yaml_config(tmp_path):
    """docs/llamafactory.md's ``train.py`` as written, launched on 2 ranks with a YAML config."""
    text = open(os.path.join(ROOT, "docs", "llamafactory.md"), encoding="utf-8").read()
    launcher = re.search(r"```python no-run\n(# train\.py\n.*?)```", text, re.S).group(1)
    (tmp_path / "train.py").write_text(launcher)
    spec = importlib.util.spec_from_file_location("llamafactory_sft", os.path.join(ROOT, "examples", "llamafactory_sft.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.build_checkpoint(str(tmp_path / "tiny-llama"))
    example.build_dataset(str(tmp_path / "train.jsonl"))
    (tmp_path / "config.yaml").write_text(
        f"model: {tmp_path / 'tiny-llama'}\ntemplate: chatml\ntrain_dataset: {tmp_path / 'train.jsonl'}\n"
        f"output_dir: {tmp_path / 'out'}\nbatching_strategy: dynamic_batching\ncutoff_len: 128\n"
        "micro_batch_size: 4\nglobal_batch_size: 16\nmax_steps: 3\nbf16: false\n")
    result = _torchrun(2, str(tmp_path / "train.py"), str(tmp_path / "config.yaml"),
                       what="docs/llamafactory.md's launcher on 2 ranks")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert (tmp_path / "out" / "config.json").exists()  # run_sft saved the trained model


@needs_llamafactory
def test_the_documented_classic_launcher_trains_from_a_yaml_config(tmp_path):
    """docs/llamafactory.md's ``train_classic.py`` as written (its cap: 8192), launched on 2 ranks
    with a ``stage: sft`` YAML config: LLaMA-Factory's ``run_exp`` trains and saves."""
    from tests.llamafactory_classic_workers import write_dataset, write_model

    text = open(os.path.join(ROOT, "docs", "llamafactory.md"), encoding="utf-8").read()
    launcher = re.search(r"```python no-run\n(# train_classic\.py\n.*?)```", text, re.S).group(1)
    (tmp_path / "train_classic.py").write_text(launcher)
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    write_model(tmp_path / "model")
    write_dataset(tmp_path / "data", over=False)
    (tmp_path / "sft_config.yaml").write_text(
        f"stage: sft\ndo_train: true\nmodel_name_or_path: {tmp_path / 'model'}\ndataset: tiny\n"
        f"dataset_dir: {tmp_path / 'data'}\ntemplate: empty\ncutoff_len: 512\nfinetuning_type: full\n"
        f"output_dir: {tmp_path / 'out'}\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\n"
        "num_train_epochs: 1\nlearning_rate: 1.0e-3\nsave_strategy: 'no'\nreport_to: none\nuse_cpu: true\n"
        "ddp_timeout: 60\ndataloader_num_workers: 0\nplot_loss: false\noverwrite_cache: true\n")
    result = _torchrun(2, str(tmp_path / "train_classic.py"), str(tmp_path / "sft_config.yaml"),
                       what="docs/llamafactory.md's classic launcher on 2 ranks")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "seqbal: per_device_train_batch_size=2 no longer limits a micro-batch" in result.stdout + result.stderr
    assert (tmp_path / "out" / "config.json").exists()  # run_exp saved the trained model
