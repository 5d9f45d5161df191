"""seqbal's axolotl plug-in inside real axolotl 0.19.0 training runs on CPU (its CLI entry, its
trainer builder, a tiny Llama saved to a temporary folder), on 1 rank and on 2 gloo ranks through
``python -m torch.distributed.run``; see ``tests/axolotl_workers.py`` for what each mode runs.

Skipped without axolotl (CI installs it in an environment of its own: its pins conflict with the
other trainers'). Every launch has a hard deadline: past ``DEADLINE_S`` the launcher's whole
process group is killed and the test fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("axolotl") is None:
    pytest.skip("needs axolotl (its own CI environment)", allow_module_level=True)

import torch  # noqa: E402

from . import axolotl_workers as workers  # noqa: E402
from .deadline import run_with_deadline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 420


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("axolotl-assets")
    workers.make_assets(folder)
    return folder


def launch(mode: str, world: int, assets: Path, tmp_path: Path) -> list[dict]:
    import yaml

    run = tmp_path / f"{mode}-{world}"
    out = run / "records"
    out.mkdir(parents=True)
    config = run / "config.yml"
    config.write_text(yaml.safe_dump({**workers.config(mode, assets),
                                      "dataset_prepared_path": str(run / "prepared"), "output_dir": str(run / "out")}))
    script = str(ROOT / "tests" / "axolotl_workers.py")
    arguments = [script, str(config), str(out), mode]
    if world == 1:
        command = [sys.executable, *arguments]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", *arguments]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               AXOLOTL_DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", WANDB_DISABLED="true")
    done = run_with_deadline(command, deadline_s=DEADLINE_S, cwd=str(run), env=env, what=f"axolotl {mode} on {world} rank(s)")
    records = [out / f"rank{rank}.json" for rank in range(world)]
    missing = [str(path) for path in records if not path.exists()]
    assert not missing, f"exit {done.returncode}, no record {missing}: {done.stderr[-4000:]}"
    return [json.loads(path.read_text()) for path in records]


@pytest.mark.parametrize("world", [1, 2])
def test_axolotl_trains_under_the_cap_with_equal_steps(world, assets, tmp_path):
    records = launch("on", world, assets, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    assert all(r["sampler"] == "AxolotlTokenBudgetBatchSampler" for r in records)
    assert all(r["average_tokens_across_devices"] and r["model_accepts_loss_kwargs"] for r in records)
    per_rank = records[0]["len"]
    assert {r["len"] for r in records} == {per_rank} and per_rank % workers.GA == 0
    assert {r["global_step"] for r in records} == {2 * per_rank // workers.GA}  # 2 epochs, the sampler's count
    plan = records[0]["plan"]
    assert all(r["plan"] == plan for r in records) and len(plan) == world
    samples = sorted(i for rank in plan for mb in rank for i in mb)
    assert samples == list(range(len(samples))) and len(samples) > 0.8 * workers.ROWS  # each once (few dropped)
    for r in records:
        assert len(r["forwards"]) == 2 * per_rank  # every micro-batch forwarded once per epoch
        assert max(r["forwards"]) <= workers.CAP, max(r["forwards"])
        assert max(r["sequences"]) <= workers.BIN_SIZE, max(r["sequences"])  # sample_packing_bin_size
        assert r["losses"][-1] < 0.5 * r["losses"][0], r["losses"]
    assert max(len(mb) for rank in plan for mb in rank) == workers.BIN_SIZE  # the bin size binds: the test has teeth


@pytest.mark.parametrize("world", [1, 2])
def test_largest_first_from_the_config_runs_every_steps_largest_row_first(world, assets, tmp_path):
    records = launch("largest", world, assets, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    per_rank, plan, drawn = records[0]["len"], records[0]["plan"], records[0]["unordered_plan"]
    assert all(r["plan"] == plan for r in records) and plan != drawn  # the order has teeth here
    for start in range(0, per_rank, workers.GA):  # every step: the same rows, reordered
        for ordered, as_drawn in zip(plan, drawn):
            assert sorted(ordered[start:start + workers.GA]) == sorted(as_drawn[start:start + workers.GA])
    for r in records:
        assert len(r["forwards"]) == 2 * per_rank and max(r["forwards"]) <= workers.CAP
    for start in range(0, 2 * per_rank, workers.GA):  # both epochs, as forwarded
        slot_largest = [max(r["forwards"][i] for r in records) for i in range(start, start + workers.GA)]
        assert slot_largest == sorted(slot_largest, reverse=True), (start, slot_largest)


def test_without_the_plugin_axolotl_is_its_own(assets, tmp_path):
    (record,) = launch("off", 1, assets, tmp_path)
    assert "error" not in record, record["error"]
    assert record["sampler"] == "MultipackBatchSampler"
    # axolotl's own normalisation: no cross-device token count, and (Llama's inner forward does not
    # name num_items_in_batch) every micro-batch's own token mean
    assert not record["average_tokens_across_devices"] and not record["model_accepts_loss_kwargs"]
    assert record["max_steps"] > 0 and record["global_step"] == record["max_steps"]  # its estimate
    assert max(record["forwards"]) <= workers.CAP and record["losses"][-1] < 0.5 * record["losses"][0]


@pytest.mark.parametrize("world", [1, 2])
def test_one_step_is_the_gradient_of_the_global_token_mean(world, assets, tmp_path):
    from transformers import LlamaForCausalLM

    records = launch("exact", world, assets, tmp_path)
    assert all("error" not in r for r in records), [r.get("error") for r in records]
    rows = records[0]["rows"]
    step = sorted(i for r in records for mb in r["plan"][r["rank"]][:workers.GA] for i in mb)
    model = LlamaForCausalLM.from_pretrained(str(assets / "model"), torch_dtype=torch.float64)
    model.load_state_dict({name: torch.tensor(value, dtype=torch.float64) for name, value in records[0]["before"].items()},
                          strict=False)
    total, count = 0, 0
    for index in step:  # one forward per sample: no packing, no accumulation, no ranks
        ids, labels = torch.tensor([rows[index]["input_ids"]]), torch.tensor(rows[index]["labels"][1:])
        logits = model(input_ids=ids).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
        count += int((labels != -100).sum())
    (total / count).backward()
    assert len(step) < len(rows) and len({len(rows[i]["input_ids"]) for i in step}) > 1
    for name, parameter in model.named_parameters():
        for r in records:
            delta = torch.tensor(r["delta"][name], dtype=torch.float64)  # lr 1 SGD: the gradient
            assert torch.allclose(delta, parameter.grad, rtol=0, atol=1e-9), (name, float((delta - parameter.grad).abs().max()))


def test_a_sample_over_the_cap_is_an_error_on_every_rank(assets, tmp_path):
    records = launch("overcap", 2, assets, tmp_path)
    for r in records:
        assert f"exceeds max_token_len={workers.OVERCAP_CAP}" in r.get("error", ""), r
    assert len({r["error"] for r in records}) == 1  # the same sample, named on every rank
