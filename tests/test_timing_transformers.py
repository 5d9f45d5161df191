"""The transformers TrainerCallback of docs/timing.md on a real (tiny, random) Llama trained by
transformers' own Trainer: every micro-batch is recorded with its lengths, the refit runs at
its step and saves a time calibration that loads. Needs transformers (the /work-style dev venv
and .ci/run's TRL environment have it); skipped where it is not installed."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the TRL environments have it)")
torch = pytest.importorskip("torch")

from seqbal.integrations.transformers_timing import lengths_of, timing_callback  # noqa: E402
from seqbal.timing import Recorder, TimeCalibration  # noqa: E402


class _Lengths(torch.utils.data.Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        ids = torch.arange(1, self.lengths[index] + 1) % 90 + 1
        return {"input_ids": ids, "labels": ids.clone()}


def _collate(rows):
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row["input_ids"])] = row["input_ids"]
        mask[i, : len(row["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_lengths_of_masks_and_packed_positions():
    assert lengths_of({"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])}) == [3, 2]
    assert lengths_of({"position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])}) == [3, 2, 4]
    with pytest.raises(ValueError, match="neither attention_mask nor position_ids"):
        lengths_of({"input_ids": torch.zeros(1, 3)})


def test_callback_records_every_micro_batch_and_refits(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=96)
    model = transformers.LlamaForCausalLM(config)
    lengths = [8, 40, 16, 64, 24, 32, 12, 48] * 3
    recorder = Recorder()
    path = tmp_path / "timing.json"
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=2,
        max_steps=6, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", learning_rate=1e-4,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Lengths(lengths), data_collator=_collate,
                                   callbacks=[timing_callback(recorder, refit_every=3, save_to=str(path), min_records=4)])
    trainer.train()
    records = recorder.records()
    assert len(records) == 6 * 2  # 6 steps x 2 micro-batches, every one recorded once
    assert all(len(r[0]) == 2 and r[1] > 0 for r in records)  # two sequences each, a positive time
    assert {s for r in records for s in r[0]} <= set(lengths)
    fitted = TimeCalibration.load(path)
    assert fitted.source == "recorder" and len(fitted.probes) == 12  # the last refit, at step 6
    if fitted.model.sequence_seconds(100) > 0:  # a tiny model's times may be all fixed cost: nothing to weigh
        assert recorder.workload_fn([10]).tolist() == fitted.workload_fn([10]).tolist()
    assert not model._forward_pre_hooks  # the hook is gone after training
