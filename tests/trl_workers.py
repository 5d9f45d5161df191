"""One training run of a real transformers ``Trainer`` or TRL ``SFTTrainer`` under seqbal's token
budget, on CPU, for ``tests/test_trl.py``; launched with ``python -m torch.distributed.run``
(or plainly for one rank). Writes one JSON record per rank to ``--out``.

Modes:
- ``sft``: TRL's ``SFTTrainer`` with ``padding_free=True`` (token cost), a few optimizer steps;
  records every forward's tokens, the losses and the step count.
- ``trainer``: plain ``Trainer`` with a padding collator (padded cost), same records.
- ``exact``: one SGD step (lr 1, float64, no clipping, no decay) of ``Trainer`` with TRL's
  padding-free collator (transformers' ``num_items_in_batch`` loss path); records
  the parameter update and the step's samples, for the test to compare with the gradient of
  one full-batch token-mean loss.
- ``overcap``: one sample over the cap; records the error.
- ``samplecap``: ``sft`` with ``max_samples_per_micro_batch=MAX_SAMPLES`` too; records every
  forward's sequence count (the packed ``position_ids``' starts).
- ``largest``: ``sft`` installed with ``micro_batch_order="largest_first"``; also records the
  epoch's plan in the sampler's own (random) slot order.
- ``orders_differ``: ``sft`` with rank 0 installing ``"largest_first"`` and the others
  ``"pipeline"``; records the error.
- ``resume``: plain ``Trainer`` (TRL's padding-free collator), 3 epochs with a checkpoint every
  step, then a fresh ``Trainer`` resumed from the checkpoint one step into epoch 1, and another
  one step into epoch 2; records the ``input_ids`` of every forward of each run, the steps per
  epoch, and the batches transformers asked ``get_resumed_dataloader`` to skip (5.25 and later).
- ``guard``: one optimizer step in each of ``GUARD_CASES`` (plain ``Trainer`` with TRL's
  padding-free collator, or ``SFTTrainer(padding_free=True)``; ``use_cache`` of the training
  arguments, which the Trainer copies into ``model.config.use_cache``; gradient checkpointing;
  the attention implementation); records each run's error, if any, its
  optimizer steps, and how far the packed logits of its first training batch are from one
  forward per sequence, computed afterwards with the very arguments that batch was forwarded
  with, in the same model state (the ground truth the guard must match).

Every rank's process group has a short timeout; the test kills the launcher at its deadline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CAP = 96
VOCAB = 48
MAX_SAMPLES = 3


#: (trainer, TrainingArguments.use_cache, gradient checkpointing, attention implementation)
GUARD_CASES = [
    ("trainer", True, False, "sdpa"),  # packed sequences attend to each other: the guard must raise
    ("trainer", True, False, "eager"),
    ("trainer", True, True, "sdpa"),  # checkpointing turns the cache off: clean
    ("trainer", False, False, "sdpa"),  # the Trainer's default
    ("sft", True, False, "sdpa"),  # SFTTrainer passes use_cache=False itself: clean
    ("sft", True, True, "sdpa"),  # TRL's default (gradient checkpointing on)
]


def tiny_model(dtype=torch.float32, use_cache: bool = False, attention: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=256, use_cache=use_cache, pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    )
    config._attn_implementation = attention
    return LlamaForCausalLM(config).to(dtype)


def tiny_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t3"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3")


def dataset_rows(count: int, seed: int, over: bool = False) -> list[dict]:
    """Learnable rows: each counts up by one from a random start (mod the vocabulary)."""
    import random

    rng = random.Random(seed)
    rows = []
    for index in range(count):
        length = rng.randint(4, 40)
        if over and index == count // 2:
            length = CAP + 5
        start = rng.randint(4, VOCAB - 1)
        rows.append({"input_ids": [4 + (start + k) % (VOCAB - 4) for k in range(length)]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("sft", "trainer", "exact", "overcap", "resume", "samplecap", "guard",
                                         "largest", "orders_differ"))
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    torch.set_num_threads(1)
    record = {"rank": rank, "world": world}
    try:
        run(options.mode, record, Path(options.out))
    except ValueError as error:
        record["error"] = str(error)
    Path(options.out, f"rank{rank}.json").write_text(json.dumps(record))


def run_resume(record: dict, out: Path) -> None:
    """Train 3 epochs uninterrupted, saving every step; then resume a fresh Trainer one step into
    epoch 1, and one into epoch 2. Records each run's forwarded ``input_ids`` (lists of token
    lists, in order)."""
    import datasets
    from transformers import Trainer, TrainingArguments
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    import seqbal.integrations.trl as seqbal_trl

    dataset = datasets.Dataset.from_list(dataset_rows(48, seed=2))
    args = TrainingArguments(
        output_dir=str(out / "run"), report_to=[], save_strategy="steps", save_steps=1, logging_steps=1,
        use_cpu=True, per_device_train_batch_size=2, gradient_accumulation_steps=2, disable_tqdm=True, seed=0,
        learning_rate=1e-2, num_train_epochs=3, lr_scheduler_type="constant", remove_unused_columns=False,
    )
    skipped: list = []

    class SkipRecordingTrainer(Trainer):
        def get_resumed_dataloader(self, dataloader, num_batches):  # called by transformers >= 5.25 only
            skipped.append(num_batches)
            return super().get_resumed_dataloader(dataloader, num_batches)

    def train(resume: "str | None") -> tuple[list, object]:
        model = tiny_model()
        seen: list = []
        model.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append(kwargs["input_ids"].tolist()), with_kwargs=True
        )
        trainer = SkipRecordingTrainer(model=model, args=args, train_dataset=dataset,
                                       data_collator=DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True))
        steps = len(trainer.get_train_dataloader()) // args.gradient_accumulation_steps
        record.setdefault("steps_per_epoch", steps)
        trainer.train(resume_from_checkpoint=resume)
        return seen, trainer

    with warnings.catch_warnings(), seqbal_trl.installed(CAP):
        warnings.simplefilter("ignore")
        record["full"], _ = train(None)
        record["resumes"] = []
        for epoch in (1, 2):
            step = epoch * record["steps_per_epoch"] + 1  # one optimizer step into the epoch
            del skipped[:]
            forwarded, trainer = train(str(out / "run" / f"checkpoint-{step}"))
            record["resumes"].append({"epoch": epoch, "step": step, "forwarded": forwarded, "skipped": list(skipped),
                                      "global_step": trainer.state.global_step})
    import transformers

    record["has_resumed_dataloader"] = hasattr(transformers.Trainer, "get_resumed_dataloader")


def packed_logit_error(model, kwargs: dict) -> float:
    """Largest |packed - per-sequence| logit of one padding-free forward with ``kwargs`` (in the
    model's current state: training mode, gradients on, its checkpointing), against one forward
    per packed sequence with no cache."""
    model.train()
    with torch.enable_grad():
        packed = model(**kwargs).logits[0].detach()
        positions = kwargs["position_ids"][0]
        starts = (positions == 0).nonzero().flatten().tolist() + [positions.numel()]
        pieces = [
            model(input_ids=kwargs["input_ids"][:, a:b], position_ids=positions[None, a:b], use_cache=False).logits[0].detach()
            for a, b in zip(starts, starts[1:])
        ]
    assert len(pieces) >= 2, "the batch must pack several sequences for the check to mean anything"
    return float((packed - torch.cat(pieces)).abs().max())


def run_guard(record: dict, out: Path) -> None:
    """One optimizer step per case of ``GUARD_CASES``; see the module docstring."""
    import datasets
    from transformers import Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    import seqbal.integrations.trl as seqbal_trl

    dataset = datasets.Dataset.from_list(dataset_rows(32, seed=3))
    record["cases"] = []
    for index, (kind, use_cache, checkpointing, attention) in enumerate(GUARD_CASES):
        model = tiny_model(use_cache=True, attention=attention)  # transformers' default; the Trainer overrides it
        first: dict = {}

        def capture(module, args, kwargs, first=first):
            if module.training and not first:  # the first training forward, as the trainer called it
                keep = ("input_ids", "position_ids", "attention_mask", "use_cache")
                first.update({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in kwargs.items() if k in keep})

        model.register_forward_pre_hook(capture, with_kwargs=True)
        common = dict(output_dir=str(out / f"guard{index}"), report_to=[], save_strategy="no", use_cpu=True,
                      per_device_train_batch_size=2, gradient_accumulation_steps=2, disable_tqdm=True, seed=0,
                      max_steps=1, learning_rate=1e-3, gradient_checkpointing=checkpointing, use_cache=use_cache)
        case = {"case": [kind, use_cache, checkpointing, attention], "error": None}
        with warnings.catch_warnings(), seqbal_trl.installed(CAP):
            warnings.simplefilter("ignore")
            if kind == "sft":
                # float32 (SFTConfig's bf16 default autocasts every later forward too, blurring the ground truth)
                args = SFTConfig(**common, padding_free=True, max_length=None, dataset_num_proc=None, bf16=False)
                trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer())
            else:
                args = TrainingArguments(**common, remove_unused_columns=False)
                trainer = Trainer(model=model, args=args, train_dataset=dataset,
                                  data_collator=DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True))
            try:
                trainer.train()
            except ValueError as error:
                case["error"] = str(error)
        case["global_step"] = trainer.state.global_step
        case["first_use_cache"] = first.get("use_cache")
        case["logit_error"] = packed_logit_error(model, first)
        record["cases"].append(case)


def run(mode: str, record: dict, out: Path) -> None:
    if mode == "resume":
        return run_resume(record, out)
    if mode == "guard":
        return run_guard(record, out)
    import datasets
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    from trl import SFTConfig, SFTTrainer

    import seqbal.integrations.trl as seqbal_trl

    dtype = torch.float64 if mode == "exact" else torch.float32
    model = tiny_model(dtype)
    forwards: list[int] = []
    sequences: list[int] = []  # per forward: packed sequences (position_ids restart at 0), else rows

    def record_forward(module, args, kwargs):
        forwards.append(int(kwargs["input_ids"].numel()))
        positions = kwargs.get("position_ids")
        rows = kwargs["input_ids"].shape[0]
        sequences.append(int((positions == 0).sum()) if positions is not None and rows == 1 else rows)

    model.register_forward_pre_hook(record_forward, with_kwargs=True)
    rows = dataset_rows(24 if mode == "exact" else 160, seed=1, over=mode == "overcap")
    dataset = datasets.Dataset.from_list(rows)
    common = dict(
        output_dir=str(out / "run"), report_to=[], save_strategy="no", logging_steps=1, use_cpu=True,
        per_device_train_batch_size=2, gradient_accumulation_steps=2, disable_tqdm=True, seed=0,
    )
    if mode == "exact":
        common.update(learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0,
                      max_grad_norm=0.0, max_steps=1, warmup_steps=0)
    else:
        common.update(learning_rate=3e-2, num_train_epochs=2, lr_scheduler_type="constant")
    max_samples = MAX_SAMPLES if mode == "samplecap" else None
    order = {"largest": "largest_first", "orders_differ": "largest_first" if record["rank"] == 0 else "pipeline"}.get(mode)
    with warnings.catch_warnings(record=True) as caught, seqbal_trl.installed(
            CAP, max_samples_per_micro_batch=max_samples, micro_batch_order=order):
        warnings.simplefilter("always")
        if mode == "trainer":
            args = TrainingArguments(**common, remove_unused_columns=True)
            labelled = dataset.map(lambda row: {"labels": row["input_ids"], "attention_mask": [1] * len(row["input_ids"])})
            tokenizer = tiny_tokenizer()

            def collate(features):
                batch = DataCollatorWithPadding(tokenizer)([{"input_ids": f["input_ids"], "attention_mask": f["attention_mask"]} for f in features])
                labels = batch["input_ids"].clone()
                labels[batch["attention_mask"] == 0] = -100
                batch["labels"] = labels
                return batch

            trainer = Trainer(model=model, args=args, train_dataset=labelled, data_collator=collate)
        elif mode == "exact":
            # transformers' own loss path: Trainer.compute_loss passes num_items_in_batch to the
            # model's loss; TRL's padding-free collator (TRL's SFTTrainer computes its loss with a
            # fused LM head instead, which matches it only to ~1e-4 in float64); the per-token loss
            # in float64 through compute_loss_func, which Trainer hands num_items_in_batch
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

            def summed_token_loss(outputs, labels, num_items_in_batch):
                # the model's own ForCausalLMLoss casts logits to float32; the same sum in float64
                logits = outputs.logits[0, :-1]
                targets = labels[0, 1:]
                total = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
                return total / num_items_in_batch

            args = TrainingArguments(**common, remove_unused_columns=False)
            trainer = Trainer(model=model, args=args, train_dataset=dataset, compute_loss_func=summed_token_loss,
                              data_collator=DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True))
        else:
            args = SFTConfig(**common, padding_free=True, max_length=None, dataset_num_proc=None)
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer())
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        dataloader = trainer.get_train_dataloader()
        sampler = dataloader.batch_sampler
        sampler = getattr(sampler, "batch_sampler", sampler)  # accelerate's shard wrapper on >1 rank
        record["sampler"] = type(sampler).__name__
        record["len"] = len(dataloader)
        record["plan"] = sampler.epoch_plan(0)
        if mode == "largest":  # the same sampler without the order: its slots as drawn
            sampler.micro_batch_order = None
            record["unordered_plan"] = sampler.epoch_plan(0)
            sampler.micro_batch_order = order
        result = trainer.train()
    record["warnings"] = [str(w.message) for w in caught if "seqbal" in str(w.message)]
    record["forwards"] = forwards
    record["sequences"] = sequences
    record["global_step"] = result.global_step
    record["losses"] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if mode == "exact":
        record["delta"] = {name: (before[name] - p.detach()).tolist() for name, p in model.named_parameters()}
        record["rows"] = [list(ids) for ids in trainer.train_dataset["input_ids"]]  # as trained (TRL may add EOS)


if __name__ == "__main__":
    main()
