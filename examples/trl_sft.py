"""Fine-tune a small causal LM with TRL's ``SFTTrainer`` under seqbal's token budget: the recipe
of docs/trl.md, runnable as it is.

Run:  python examples/trl_sft.py                               (one process)
      torchrun --nproc_per_node=2 examples/trl_sft.py          (two data-parallel ranks)

Nothing is downloaded. A word-level tokenizer (the ``tokenizers`` library, wrapped in
transformers' ``PreTrainedTokenizerFast``) and a small Llama built from a config are saved to a
temporary directory, and ``SFTTrainer`` loads both from that path, as it would a checkpoint of
your own (``HF_HUB_OFFLINE=1`` is set, so a download attempt would fail).

The same epoch of the same dataset is trained twice, padding-free
(``SFTConfig(padding_free=True, max_length=None)``; TRL 1.16 refuses ``padding_free=True``
with a ``max_length`` unless it packs rows itself):

- ``trl``: TRL's own batching, ``per_device_train_batch_size`` samples per forward, chosen so
  that the *mean* forward fills the budget (``CAP / mean length``);
- ``seqbal``: the same trainer after ``seqbal_trl.install(CAP)``: every forward holds as many
  samples as fit under ``CAP`` tokens, the same number of forwards on every rank.

Rank 0 prints, for each route and rank, the forwards, the tokens per forward (mean and largest)
against the cap, the forwards over it and the loss. Exit code 1 if a seqbal forward exceeds the
cap, or the ranks ran different numbers of forwards.
"""

from __future__ import annotations

import datetime
import os
import random
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything below is local: a download attempt fails
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

CAP = 512  # tokens per forward (the budget)
SAMPLES = 256
WORDS = 120  # vocabulary: 4 special tokens and the words w0 .. w119
GA = 2  # gradient_accumulation_steps


def build_checkpoint(directory: str) -> None:
    """A tokenizer and a randomly initialised Llama, saved to ``directory`` like any checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3}
    vocab.update({f"w{i}": 4 + i for i in range(WORDS)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="[BOS]",
                                        eos_token="[EOS]", unk_token="[UNK]")
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(directory)


def build_dataset():
    """``SAMPLES`` texts with a long tail of lengths (8-400 words), each counting up through the
    words from a random start, so that the loss can fall. The same on every rank."""
    import datasets

    rng = random.Random(0)
    texts = []
    for _ in range(SAMPLES):
        length = min(400, max(8, int(rng.lognormvariate(4.0, 0.8))))
        start = rng.randrange(WORDS)
        texts.append(" ".join(f"w{(start + k) % WORDS}" for k in range(length)))
    return datasets.Dataset.from_dict({"text": texts})


def train(route: str, checkpoint: str, dataset, batch_size: int, output_dir: str) -> dict:
    """One epoch of ``SFTTrainer``; what every forward held, and the losses."""
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    import seqbal.integrations.trl as seqbal_trl

    config = SFTConfig(
        output_dir=output_dir, padding_free=True, max_length=None,  # the two settings padding-free needs
        per_device_train_batch_size=batch_size, gradient_accumulation_steps=GA, num_train_epochs=1,
        learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
        disable_tqdm=True, use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(), seed=0,
        dataset_num_proc=None,
        activation_checkpointing=True,  # TRL's default, by transformers' new name: the old one warns on every run
    )
    if route == "seqbal":
        seqbal_trl.install(CAP)  # the one line: every forward at most CAP tokens
    try:
        trainer = SFTTrainer(model=checkpoint, args=config, train_dataset=dataset)
        trainer.remove_callback(PrinterCallback)  # the table below says what matters
        tokens, samples = [], []

        def count(module, args, kwargs):  # one padding-free row per forward: every token is real
            if module.training:
                tokens.append(int(kwargs["input_ids"].numel()))
                samples.append(int((kwargs["position_ids"] == 0).sum()))

        trainer.model.register_forward_pre_hook(count, with_kwargs=True)
        trainer.train()
    finally:
        seqbal_trl.uninstall()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {"tokens": tokens, "samples": samples, "losses": losses}


def main() -> int:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*seqbal: per_device_train_batch_size")  # said here instead
    world = int(os.environ.get("WORLD_SIZE", 1))
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = os.path.join(scratch, "tiny-llama")
        # every process its own copy, written before the process group exists (once it does,
        # save_pretrained writes on rank 0 only)
        build_checkpoint(checkpoint)
        if world > 1 and not dist.is_initialized():
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            dist.init_process_group("nccl" if gpus >= world else "gloo", timeout=datetime.timedelta(minutes=5))
        rank = dist.get_rank() if dist.is_initialized() else 0
        dataset = build_dataset()
        lengths = [len(text.split()) + 1 for text in dataset["text"]]  # + EOS, which SFTTrainer appends
        batch_size = max(1, CAP * len(lengths) // sum(lengths))  # the mean forward fills the budget
        results = {route: train(route, checkpoint, dataset, batch_size, os.path.join(scratch, route))
                   for route in ("trl", "seqbal")}
    gathered = [results]
    if dist.is_initialized():
        gathered = [None] * world
        dist.all_gather_object(gathered, results)
    seqbal_runs = [per_rank["seqbal"] for per_rank in gathered]
    within = all(max(run["tokens"]) <= CAP for run in seqbal_runs)
    same = len({len(run["tokens"]) for run in seqbal_runs}) == 1
    every = sum(sum(run["samples"]) for run in seqbal_runs) == len(lengths)
    ok = within and same and every
    if rank == 0:
        print(f"TRL SFTTrainer, padding-free, on {world} rank(s): {len(lengths)} samples of {min(lengths)}-"
              f"{max(lengths)} tokens ({sum(lengths)} in all), cap {CAP} tokens per forward; TRL's route: "
              f"per_device_train_batch_size={batch_size} (cap / mean length)")
        print(f"{'route':<7}{'rank':>5}{'forwards':>10}{'samples':>9}{'mean tokens':>13}{'largest':>9}{'cap':>6}"
              f"{'over cap':>10}   loss")
        for route in ("trl", "seqbal"):
            for r, per_rank in enumerate(gathered):
                run = per_rank[route]
                over = sum(t > CAP for t in run["tokens"])
                mean = sum(run["tokens"]) / len(run["tokens"])
                print(f"{route:<7}{r:>5}{len(run['tokens']):>10}{sum(run['samples']):>9}{mean:>13.1f}"
                      f"{max(run['tokens']):>9}{CAP:>6}{over:>10}   {run['losses'][0]:.3f} -> {run['losses'][-1]:.3f}")
        print(f"seqbal: every forward within the cap: {within}; the same forwards on every rank: {same}; "
              f"every sample once: {every}")
        print("check: OK" if ok else "check: FAILED")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
