"""One real axolotl training run on CPU, through axolotl's own CLI entry (``axolotl.cli.train``'s
``do_cli``: the YAML config, its dataset loading, model loading, trainer builder and plug-ins),
for ``tests/test_axolotl.py``; launched with ``python -m torch.distributed.run`` (or plainly for one
rank). A tiny Llama and a word-level tokenizer are saved to a folder first (:func:`make_assets`):
nothing is downloaded.

The run is observed by a second plug-in of the config, ``tests.axolotl_workers.RecordPlugin``,
named after seqbal's in ``plugins:`` so axolotl calls it after seqbal's: it hooks the model's
forward (non-pad tokens and packed sequences of every forward), reads the trainer's dataloader,
loss settings and plan, and after training writes one JSON record per rank to the run's folder.

Modes (:func:`config`):
- ``on``: seqbal's plug-in, ``sequence_len`` 64 x ``micro_batch_size`` 2 (cap 128),
  ``sample_packing_bin_size`` 4, 2 epochs, AdamW; records forwards, losses, steps.
- ``off``: the same config without seqbal's plug-in (axolotl's own ``MultipackBatchSampler``).
- ``exact``: seqbal's plug-in, one SGD step (lr 1, no clipping, no decay), the model in float64,
  every sample's first token unlabelled, the collator's attention mask dropped before the forward
  (:func:`_packed_by_positions`: packed sequences from ``position_ids``); the per-token loss in float64 through ``compute_loss_func``, which the
  trainer hands ``num_items_in_batch``; records the update, the step's plan and the rows.
- ``overcap``: ``seqbal_max_token_len`` 32 under samples of up to 40 tokens; records the error.
- ``largest``: ``on`` with ``seqbal_micro_batch_order: largest_first``; also records the epoch's
  plan in the sampler's own (random) slot order.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

VOCAB = 48
#: letters only (a word with digits can be split by tokenizer settings): pad, BOS, EOS, UNK, then 44 words
WORDS = ["<pad>", "<s>", "</s>", "<unk>"] + [a + b for a in "bcdfghjklmn" for b in "aeiou"][:44]
SEQUENCE_LEN = 64
MICRO = 2
CAP = SEQUENCE_LEN * MICRO
BIN_SIZE = 4
GA = 2
ROWS = 160
EXACT_ROWS = 24
OVERCAP_CAP = 32


def make_assets(folder: Path) -> None:
    """A tiny Llama (float32) and its word-level tokenizer in ``folder/model``, and two datasets:
    ``text.jsonl`` (completion: every token labelled) and ``segments.jsonl`` (input_output: the
    first token of every sample unlabelled). Samples count up by one from a random start."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder / "model")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512, use_cache=False,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(folder / "model")
    rng = random.Random(1)
    with open(folder / "text.jsonl", "w") as text, open(folder / "segments.jsonl", "w") as segments:
        for _ in range(ROWS):
            length, start = rng.randint(4, 40), rng.randint(4, VOCAB - 1)
            words = [WORDS[4 + (start + k) % (VOCAB - 4)] for k in range(length)]
            text.write(json.dumps({"text": " ".join(words)}) + "\n")
            segments.write(json.dumps({"segments": [{"label": False, "text": words[0]},
                                                    {"label": True, "text": " " + " ".join(words[1:])}]}) + "\n")


def config(mode: str, folder: Path) -> dict[str, Any]:
    """The axolotl YAML config of ``mode`` (see the module docstring), as a dict."""
    seqbal = ["seqbal.integrations.axolotl.SeqbalPlugin"] if mode != "off" else []
    cfg: dict[str, Any] = {
        "base_model": str(folder / "model"),
        "datasets": [{"path": str(folder / "text.jsonl"), "ds_type": "json", "type": "completion"}],
        "dataset_prepared_path": str(folder / f"prepared-{mode}"), "output_dir": str(folder / f"out-{mode}"),
        "val_set_size": 0, "sequence_len": SEQUENCE_LEN, "sample_packing": True, "micro_batch_size": MICRO,
        "sample_packing_bin_size": BIN_SIZE, "gradient_accumulation_steps": GA, "num_epochs": 2,
        "learning_rate": 0.03, "optimizer": "adamw_torch", "lr_scheduler": "constant", "bf16": False, "fp16": False,
        "tf32": False, "logging_steps": 1, "save_strategy": "no", "seed": 0, "ddp_timeout": 60,
        "dataloader_num_workers": 0, "plugins": seqbal + ["tests.axolotl_workers.RecordPlugin"],
    }
    if mode == "exact":
        cfg.update(datasets=[{"path": str(folder / "segments.jsonl"), "ds_type": "json", "type": "input_output"}],
                   optimizer="sgd", learning_rate=1.0, max_grad_norm=0.0, weight_decay=0.0, warmup_steps=0,
                   max_steps=1)
    if mode == "overcap":
        cfg["seqbal_max_token_len"] = OVERCAP_CAP
    if mode == "largest":
        cfg["seqbal_micro_batch_order"] = "largest_first"
    return cfg


def _record_forward(record: dict) -> Any:
    def hook(module: Any, args: Any, kwargs: dict) -> None:
        ids = kwargs["input_ids"]
        record.setdefault("forward_keys", sorted(k for k, v in kwargs.items() if v is not None))
        record["forwards"].append(int((ids != 0).sum()))  # pad is token 0; the data never use it
        positions = kwargs.get("position_ids")
        record["sequences"].append(int(((positions == 0) & (ids != 0)).sum()) if positions is not None else int(ids.shape[0]))
    return hook


def _packed_by_positions(module: Any, args: Any, kwargs: dict) -> Any:
    """Drop the collator's attention mask so that transformers masks the packed row per sample,
    from ``position_ids`` (on a GPU, axolotl's flash attention does the same from its sample-id
    mask; on the CPU, sdpa reads that mask as plain padding and lets packed samples attend to one
    another, which no per-sample reference reproduces)."""
    kwargs.pop("attention_mask", None)
    return args, kwargs


def _summed_token_loss(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
    """The causal LM loss in float64 (the model's own casts logits to float32): label tokens of the
    packed row, summed, over transformers' ``num_items_in_batch``."""
    import torch

    logits = outputs.logits[0, :-1]
    total = torch.nn.functional.cross_entropy(logits, labels[0, 1:], ignore_index=-100, reduction="sum")
    return total / num_items_in_batch


def _plugin_class() -> type:
    from axolotl.integrations.base import BasePlugin

    class RecordPlugin(BasePlugin):
        """Observes one run and writes ``rank{r}.json`` to ``$SEQBAL_AXOLOTL_OUT``."""

        record: dict = {}

        def post_model_load(self, cfg: Any, model: Any) -> None:
            import torch

            if os.environ["SEQBAL_AXOLOTL_MODE"] == "exact":
                model.to(torch.float64)
            self.record.update(forwards=[], sequences=[])
            model.register_forward_pre_hook(_record_forward(self.record), with_kwargs=True)
            if os.environ["SEQBAL_AXOLOTL_MODE"] == "exact":
                model.register_forward_pre_hook(_packed_by_positions, with_kwargs=True)

        def post_trainer_create(self, cfg: Any, trainer: Any) -> None:
            record = self.record
            record["trainer"] = trainer
            if os.environ["SEQBAL_AXOLOTL_MODE"] == "exact":
                trainer.compute_loss_func = _summed_token_loss
                record["before"] = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
            dataloader = trainer.get_train_dataloader()
            sampler = dataloader.batch_sampler
            sampler = getattr(sampler, "batch_sampler", sampler)  # accelerate's shard wrapper on >1 rank
            record.update(sampler=type(sampler).__name__, len=len(dataloader),
                          average_tokens_across_devices=bool(trainer.args.average_tokens_across_devices),
                          model_accepts_loss_kwargs=bool(trainer.model_accepts_loss_kwargs),
                          max_steps=int(trainer.args.max_steps))
            if hasattr(sampler, "epoch_plan"):
                record["plan"] = sampler.epoch_plan(0)
                if sampler.micro_batch_order is not None:  # the same sampler without the order: slots as drawn
                    order, sampler.micro_batch_order = sampler.micro_batch_order, None
                    record["unordered_plan"] = sampler.epoch_plan(0)
                    sampler.micro_batch_order = order

        def post_train(self, cfg: Any, model: Any) -> None:
            record = self.record
            if "trainer" not in record:  # axolotl 0.19.0 calls post_train twice (execute_training, then train)
                return
            trainer = record.pop("trainer")
            record["global_step"] = trainer.state.global_step
            record["losses"] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
            before = record.pop("before", None)
            if before is not None:
                record["delta"] = {name: (before[name] - p.detach()).tolist() for name, p in model.named_parameters()}
                record["before"] = {name: value.tolist() for name, value in before.items()}
                data = trainer.train_dataset
                record["rows"] = [{"input_ids": list(data[i]["input_ids"]), "labels": list(data[i]["labels"])}
                                  for i in range(len(data))]

    RecordPlugin.__module__ = __name__
    return RecordPlugin


def __getattr__(name: str) -> Any:  # axolotl is imported only when axolotl looks the plug-in up
    if name == "RecordPlugin":
        cls = _plugin_class()
        globals()["RecordPlugin"] = cls
        return cls
    raise AttributeError(name)


def _place_ranks_on_the_cpu() -> None:
    """The one CUDA hard-code on this path: axolotl 0.19.0's ``normalize_config`` sets
    ``device_map = {"": LOCAL_RANK}`` whenever ``world_size != 1`` (an accelerator index, which
    transformers refuses without one). Without CUDA, map the model to the CPU instead; nothing
    else of axolotl's is changed."""
    import torch
    import axolotl.cli.config as cli_config

    if torch.cuda.is_available():
        return
    normalize = cli_config.normalize_config

    def normalize_on_cpu(cfg: Any) -> Any:
        result = normalize(cfg)
        if cfg.world_size != 1:
            cfg.device_map = {"": "cpu"}
        return result

    cli_config.normalize_config = normalize_on_cpu


def main() -> None:
    config_path, out, mode = sys.argv[1:4]
    os.environ.update(SEQBAL_AXOLOTL_OUT=out, SEQBAL_AXOLOTL_MODE=mode)
    # accelerate's own switch for DDP over gloo on the CPU (transformers' use_cpu, which axolotl's
    # config does not expose)
    os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    sys.argv = sys.argv[:1]  # axolotl's CLI parses the rest of argv for its own flags
    rank = int(os.environ.get("RANK", 0))
    import torch

    torch.set_num_threads(1)
    from axolotl.cli.train import do_cli

    _place_ranks_on_the_cpu()

    record: dict = {"rank": rank, "world": int(os.environ.get("WORLD_SIZE", 1))}
    try:
        do_cli(config=config_path)
        from tests import axolotl_workers  # the module axolotl loaded the plug-in from (this one is __main__)

        record.update(axolotl_workers.RecordPlugin.record)
    except ValueError as error:
        record["error"] = str(error)
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
