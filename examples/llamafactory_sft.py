"""Fine-tune a small causal LM with LLaMA-Factory's new trainer (``llamafactory.v1``) under
seqbal's fixed-count steps: the recipe of docs/llamafactory.md, runnable as it is.

Run:  python examples/llamafactory_sft.py [seqbal|llamafactory]                 (one process)
      torchrun --standalone --nproc_per_node=2 examples/llamafactory_sft.py     (two ranks)

Nothing is downloaded. A word-level tokenizer and a small Llama built from a config are saved to
a temporary directory with a JSON-lines dataset of chat samples (LLaMA-Factory's ``messages``
format), and LLaMA-Factory's own ``SFTTrainer`` trains on them with
``batching_strategy: dynamic_batching``, ``MAX_STEPS`` steps of ``NUM_MICRO_BATCH``
micro-batches per rank. ``seqbal`` (the default) installs seqbal first; ``llamafactory`` runs
LLaMA-Factory's own strategy, for comparison.

Rank 0 prints, for every rank, the forwards, the padded tokens per forward (mean and largest)
against the budget ``CUTOFF_LEN x MICRO_BATCH_SIZE``, the forwards over it, the samples
truncated, and the loss. With seqbal the exit code is 1 if a forward exceeds the budget, a
sample was truncated, or a step ran another number of micro-batches than ``NUM_MICRO_BATCH``
on some rank.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local: a download attempt fails
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

CUTOFF_LEN = 128
MICRO_BATCH_SIZE = 4  # the budget: CUTOFF_LEN x MICRO_BATCH_SIZE = 512 padded tokens per forward
NUM_MICRO_BATCH = 2
MAX_STEPS = 12
SAMPLES = 160
WORDS = 120


def build_checkpoint(directory: str) -> None:
    """A word-level tokenizer and a randomly initialised Llama, saved like any checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3}
    vocab.update({f"w{i}": 4 + i for i in range(WORDS)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                            unk_token="[UNK]").save_pretrained(directory)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(directory)


def build_dataset(path: str) -> None:
    """``SAMPLES`` chat samples with a long tail of lengths (a few to 200 tokens: some longer than
    ``CUTOFF_LEN``, all within the budget), in LLaMA-Factory's ``messages`` format."""
    rng = random.Random(0)
    with open(path, "w") as out:
        for _ in range(SAMPLES):
            words = min(190, max(4, int(rng.lognormvariate(3.4, 0.7))))
            start = rng.randrange(WORDS)
            answer = " ".join(f"w{(start + k) % WORDS}" for k in range(words))
            messages = [
                {"role": "user", "content": [{"type": "text", "value": f"w{start}"}], "loss_weight": 0.0},
                {"role": "assistant", "content": [{"type": "text", "value": answer}], "loss_weight": 1.0},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")


def train(route: str, scratch: str) -> dict:
    """LLaMA-Factory's own ``run_sft`` steps (arguments, data engine, model engine, trainer, fit),
    with a hook that records what every training forward held."""
    from llamafactory.v1.accelerator.interface import DistributedInterface
    from llamafactory.v1.config import get_args
    from llamafactory.v1.core.data_engine import DataEngine
    from llamafactory.v1.core.model_engine import ModelEngine
    from llamafactory.v1.trainers.sft_trainer import SFTTrainer

    if route == "seqbal":
        from seqbal.integrations import llamafactory as seqbal_llamafactory

        seqbal_llamafactory.install()  # the one line: cap = cutoff_len x micro_batch_size, never exceeded
    model_args, data_args, training_args, _ = get_args({
        "model": os.path.join(scratch, "tiny-llama"), "template": "chatml",
        "train_dataset": os.path.join(scratch, "train.jsonl"), "output_dir": os.path.join(scratch, "out"),
        "batching_strategy": "dynamic_batching", "cutoff_len": CUTOFF_LEN, "micro_batch_size": MICRO_BATCH_SIZE,
        "global_batch_size": MICRO_BATCH_SIZE * NUM_MICRO_BATCH * int(os.environ.get("WORLD_SIZE", 1)),
        "max_steps": MAX_STEPS, "learning_rate": 3e-3, "bf16": False, "batching_workers": 0, "seed": 0,
    })
    DistributedInterface(training_args.dist_config)
    model_engine = ModelEngine(model_args, is_train=True)
    forwards: list[tuple[int, int, int]] = []  # (rows, padded width, real tokens) of every forward

    def record(module, args, kwargs):
        if module.training:
            mask = kwargs["attention_mask"]
            forwards.append((int(mask.shape[0]), int(mask.shape[1]), int(mask.sum())))

    model_engine.model.register_forward_pre_hook(record, with_kwargs=True)
    trainer = SFTTrainer(args=training_args, model=model_engine.model, renderer=model_engine.renderer,
                         train_dataset=DataEngine(data_args.train_dataset))
    losses: list[float] = []
    original_on_log = trainer.callback_handler.on_log

    def on_log(args, state, logs, *rest, **kwargs):
        losses.append(float(logs["loss"]))
        return original_on_log(args, state, logs, *rest, **kwargs)

    trainer.callback_handler.on_log = on_log
    trainer.fit()
    lengths = [len(s["input_ids"]) for s in trainer.renderer.process_samples(
        [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])]
    result = {"forwards": forwards, "losses": losses, "truncated": sum(n > CUTOFF_LEN for n in lengths),
              "longest": max(lengths)}
    gathered = [result]
    if torch.distributed.is_initialized():
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, result)
    DistributedInterface().destroy()
    return {"ranks": gathered}


def main() -> int:
    route = sys.argv[1] if len(sys.argv) > 1 else "seqbal"
    if route not in ("seqbal", "llamafactory"):
        print(f"usage: {sys.argv[0]} [seqbal|llamafactory]", file=sys.stderr)
        return 2
    budget = CUTOFF_LEN * MICRO_BATCH_SIZE
    with tempfile.TemporaryDirectory() as scratch:
        build_checkpoint(os.path.join(scratch, "tiny-llama"))
        build_dataset(os.path.join(scratch, "train.jsonl"))
        ranks = train(route, scratch)["ranks"]
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    first = ranks[0]
    print(f"LLaMA-Factory SFTTrainer, dynamic_batching, {route}, on {len(ranks)} rank(s): {SAMPLES} samples, "
          f"longest {first['longest']} tokens ({first['truncated']} over cutoff_len {CUTOFF_LEN}); budget "
          f"{budget} padded tokens per forward, {NUM_MICRO_BATCH} micro-batches x {MAX_STEPS} steps per rank")
    print(f"{'rank':>4}{'forwards':>10}{'mean padded':>13}{'largest':>9}{'budget':>8}{'over':>6}   loss")
    ok = True
    for rank, run in enumerate(ranks):
        padded = [rows * width for rows, width, _ in run["forwards"]]
        over = sum(p > budget for p in padded)
        loss = f"{run['losses'][0]:.3f} -> {run['losses'][-1]:.3f}" if run["losses"] else "-"
        print(f"{rank:>4}{len(padded):>10}{sum(padded) / len(padded):>13.1f}{max(padded):>9}{budget:>8}{over:>6}   {loss}")
        real = sum(tokens for _, _, tokens in run["forwards"])
        ok = ok and over == 0 and len(padded) == NUM_MICRO_BATCH * MAX_STEPS and real > 0
    if route == "seqbal":
        # seqbal pads to the micro-batch's longest sample and never cuts one: the widest forward
        # may exceed cutoff_len, and a sample longer than the budget would have been an error
        print("check: OK" if ok else "check: FAILED")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
