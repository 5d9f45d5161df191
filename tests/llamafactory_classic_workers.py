"""One real LLaMA-Factory SFT run (``llamafactory.train.tuner.run_exp()`` with a YAML config on
the command line, as ``llamafactory-cli train`` runs it; ``stage: sft``, its
``CustomSeq2SeqTrainer``) on CPU, for ``tests/test_llamafactory_classic.py``; launched with
``python -m torch.distributed.run`` (or plainly for one rank). Writes one JSON record per rank
to ``--out``. Nothing is downloaded: a tiny Llama, a word-level tokenizer and an alpaca-format
dataset are written to ``--out`` first. Run with ``examples/llamafactory_cpu`` (docs/llamafactory.md's CPU route) on ``PYTHONPATH``
(torchaudio's stand-in: LLaMA-Factory imports torchaudio, whose index build needs CUDA).

Modes:
- ``budget``: seqbal installed with ``CAP``; 2 epochs; records every training forward's padded
  shape and its rows (each row's tokens up to its attention mask), the dataset's rows, the
  sampler's class and length, and the trainer's final step.
- ``overcap``: ``budget`` with one sample of ``LONG`` tokens (> ``CAP``, < ``CUTOFF``); records
  the error.
- ``plain``: seqbal installed and uninstalled again, then the ``overcap`` data through
  LLaMA-Factory's own sampler, 1 epoch; the same records.
- ``packed``: ``budget`` with LLaMA-Factory's ``neat_packing`` (rows packed up to ``PACKED_CUTOFF``
  tokens, a block-diagonal attention mask), 1 epoch; records the forwards' shapes.
- ``resume``: ``budget`` saving a checkpoint every step; with ``--resume-step N``, a fresh launch
  (LLaMA-Factory tears its process group down after a run) that resumes from checkpoint ``N``
  of that run, in the same ``--out``, and writes ``resumed<rank>.json``.

Every rank's process group has a short timeout; the test kills the launcher at its deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CAP = 96
VOCAB = 128
SAMPLES = 40
LONG = CAP + 14
CUTOFF = 512
PACKED_CUTOFF = 40
GA = 2
EPOCHS = 2


def write_model(folder: Path) -> None:
    """A one-layer Llama and a whitespace word-level tokenizer (words ``t4`` .. ``t127``)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    # special tokens that no word contains: the tokenizer matches them anywhere in the text
    special = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {**{token: i for i, token in enumerate(special)}, **{f"t{i}": i for i in range(len(special), VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)


def write_dataset(folder: Path, over: bool) -> None:
    """``SAMPLES`` alpaca rows; row ``i``'s instruction starts with the token ``t{4+i}`` (so every
    row is unique), then counts up; with ``over`` the middle row has ``LONG`` tokens."""
    import random

    rng = random.Random(1)
    rows = []
    for index in range(SAMPLES):
        prompt = rng.randint(3, 30)
        answer = rng.randint(2, 20)
        if over and index == SAMPLES // 2:
            prompt, answer = LONG - 20, 20  # the "empty" template adds nothing: LONG tokens
        start = rng.randint(50, VOCAB - 1)
        words = [f"t{50 + (start + k) % (VOCAB - 50)}" for k in range(prompt + answer)]
        rows.append({"instruction": " ".join([f"t{4 + index}"] + words[: prompt - 1]), "input": "",
                     "output": " ".join(words[prompt - 1:prompt - 1 + answer])})
    (folder / "tiny.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"tiny": {"file_name": "tiny.json"}}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("budget", "overcap", "plain", "resume", "packed", "largest"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume-step", type=int, default=None)
    options = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    out = Path(options.out)
    import torch

    torch.set_num_threads(1)
    # On several CPU ranks accelerate's device is "cpu:0", so checkpoints tag their tensors
    # "cpu:0", which torch.load cannot map back when transformers resumes; load them on the CPU.
    torch.serialization.register_package(
        30, lambda obj: None, lambda obj, location: obj if location.startswith("cpu:") else None)
    from transformers import TrainerCallback

    import seqbal.integrations._llamafactory_classic as classic
    import seqbal.integrations.llamafactory as seqbal_llamafactory  # the public call, for both trainers

    model_dir, data_dir = out / "model", out / "data"
    if options.resume_step is not None:
        pass  # the saving launch wrote the model and the data
    elif rank == 0:
        model_dir.mkdir(exist_ok=True)
        data_dir.mkdir(exist_ok=True)
        write_model(model_dir)
        write_dataset(data_dir, over=options.mode in ("overcap", "plain"))
        (out / "ready").write_text("")
    else:
        import time

        while not (out / "ready").exists():
            time.sleep(0.2)

    record: dict = {"rank": rank, "forwards": [], "warnings": []}

    class Recorder(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
            dataset = train_dataloader.dataset
            record["rows"] = [list(map(int, ids)) for ids in dataset["input_ids"]]
            inner = getattr(train_dataloader, "batch_sampler", None)
            inner = getattr(inner, "batch_sampler", inner)
            record["sampler"] = type(inner).__name__
            record["len"] = len(train_dataloader)
            if isinstance(inner, classic.LlamaFactoryTokenBudgetBatchSampler):
                record["plans"] = [inner.epoch_plan(epoch) for epoch in range(EPOCHS)]
                if inner.micro_batch_order is not None:  # the same sampler without the order: slots as drawn
                    order, inner.micro_batch_order = inner.micro_batch_order, None
                    record["unordered_plans"] = [inner.epoch_plan(epoch) for epoch in range(EPOCHS)]
                    inner.micro_batch_order = order

            def seen(module, args, kwargs):
                if module.training:
                    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
                    rows = [ids[r][mask[r].bool()].tolist() for r in range(ids.shape[0])] if mask.dim() == 2 else None
                    record["forwards"].append({"shape": list(ids.shape), "rows": rows})

            model.register_forward_pre_hook(seen, with_kwargs=True)

        def on_train_end(self, args, state, control, **kwargs):
            record["global_step"] = state.global_step

    seqbal_llamafactory.install(CAP, micro_batch_order="largest_first" if options.mode == "largest" else None)
    if options.mode == "plain":
        seqbal_llamafactory.uninstall()
    arguments = {
        "stage": "sft", "do_train": True, "model_name_or_path": str(model_dir), "trust_remote_code": True,
        "dataset": "tiny", "dataset_dir": str(data_dir), "template": "empty", "cutoff_len": CUTOFF,
        "finetuning_type": "full", "output_dir": str(out / f"run{rank}"), "overwrite_output_dir": True,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": GA,
        "num_train_epochs": 1 if options.mode == "plain" else EPOCHS, "learning_rate": 1e-3,
        "lr_scheduler_type": "constant", "logging_steps": 1, "save_strategy": "no", "report_to": "none",
        "use_cpu": True, "seed": 0, "disable_tqdm": True, "overwrite_cache": True, "ddp_timeout": 60,
        "dataloader_num_workers": 0, "plot_loss": False,
    }
    if options.mode == "packed":
        arguments.update(neat_packing=True, cutoff_len=PACKED_CUTOFF, num_train_epochs=1)
    if options.mode == "resume":
        arguments.update(save_strategy="steps", save_steps=1, output_dir=str(out / "run"))
        if options.resume_step is not None:
            arguments["resume_from_checkpoint"] = str(out / "run" / f"checkpoint-{options.resume_step}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from llamafactory.train.tuner import run_exp

            # the documented route: a YAML config on the command line, read by run_exp() as
            # llamafactory-cli train reads it
            config = out / f"config{rank}{'' if options.resume_step is None else '-resumed'}.yaml"
            config.write_text(json.dumps(arguments))  # JSON is YAML
            sys.argv = [sys.argv[0], str(config)]
            run_exp(callbacks=[Recorder()])
        record["warnings"] = [str(w.message) for w in caught if "seqbal" in str(w.message)]
    except ValueError as error:
        record["error"] = str(error)
    finally:
        seqbal_llamafactory.uninstall()
    name = "rank" if options.resume_step is None else "resumed"
    Path(out, f"{name}{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
