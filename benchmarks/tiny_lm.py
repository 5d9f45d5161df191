"""A tiny causal transformer on packed sequences, for metering memory (benchmarks and smoke tests).

Sequences are packed into one row of tokens, as remove-padding trainers run them: the linear
layers, norms and the loss see all the micro-batch's tokens at once, attention runs on each
sequence alone (what varlen kernels do). Two attention kinds:

- ``eager``: ``softmax(q k^T / sqrt(d) + causal mask) v`` written out, so every sequence's
  ``heads x s x s`` probabilities are kept for the backward pass (quadratic memory, as in
  Hugging Face's eager attention);
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``, whose
  fused kernels keep no score matrix (linear memory on the CPU's flash kernel and on CUDA).

How each sequence's window is cut from the packed tokens: ``packing="slices"`` (the default)
indexes a window per sequence, whose backward adds a full-size zero gradient per sequence (a
cost of sequences x tokens that no varlen kernel has); ``packing="split"`` cuts them with one
``split``, whose backward is one concatenation, as a varlen kernel's cost grows (the timing
benchmark uses it).

Two MLP kinds: ``gelu`` (``down(gelu(up(x)))``, width ``4 x hidden``) and ``gated`` (Llama's
SwiGLU, ``down(silu(gate(x)) * up(x))`` at ``intermediate`` width), so that a Llama-shaped
config dict (:func:`llama_config`) describes the model's linear layers exactly.

``step(lengths)`` runs one forward and backward on random tokens of those lengths and leaves
no gradient behind (``zero_grad(set_to_none=True)``), the contract of
:func:`seqbal.memory.calibrate`.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_KINDS = ("eager", "sdpa")
MLP_KINDS = ("gelu", "gated")

#: glibc's ``mallopt`` parameters (``malloc.h``).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory mapped, as a GPU's caching allocator keeps freed
    blocks, before a CPU step is timed. True where it applied (glibc), False elsewhere.

    By default glibc serves each allocation over 32 MiB with its own ``mmap`` and unmaps it when
    freed, so eager attention's score matrices of a long sequence (``heads x s x s`` floats,
    64 MiB at 2,048 tokens and 4 heads) are faulted in afresh at every call: on a 2-core
    machine that was up to 1.1 s of system time in a 2.9 s step, varying from call to call with
    what ran before, a cost of the CPU's allocator that no GPU step pays and no workload of
    lengths describes. With every allocation from the heap and no trimming, the pages stay
    mapped after the first call. The process then keeps its peak memory for good (fine for a
    benchmark process)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


class _Block(nn.Module):
    def __init__(self, hidden: int, heads: int, attention: str, mlp: str = "gelu", intermediate: int = 0,
                 packing: str = "slices") -> None:
        super().__init__()
        self.heads, self.attention, self.packing = heads, attention, packing
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        width = intermediate or 4 * hidden
        self.gate = nn.Linear(hidden, width, bias=False) if mlp == "gated" else None
        self.up = nn.Linear(hidden, width, bias=False)
        self.down = nn.Linear(width, hidden, bias=False)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = q.shape[-2]
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        return scores.masked_fill(causal, float("-inf")).softmax(-1) @ v

    def forward(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        t, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, hidden // self.heads).permute(1, 2, 0, 3)
        pieces, start = [], 0
        if self.packing == "split":  # one cut, one concatenation in the backward
            for qs, ks, vs in zip(q.split(list(lengths), 1), k.split(list(lengths), 1), v.split(list(lengths), 1)):
                pieces.append(self._attend(qs[None], ks[None], vs[None])[0])
        else:
            for s in lengths:  # one sequence at a time, as a varlen kernel sees them; 4-D for the fused kernels
                window = slice(start, start + s)
                pieces.append(self._attend(q[None, :, window], k[None, :, window], v[None, :, window])[0])
                start += s
        attended = torch.cat(pieces, dim=1).transpose(0, 1).reshape(t, hidden)
        x = x + self.out(attended)
        h = self.norm2(x)
        if self.gate is not None:
            return x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x + self.down(F.gelu(self.up(h)))


class TinyLM(nn.Module):
    """Embedding, ``layers`` pre-norm blocks, a tied-free LM head; the loss is next-token
    cross-entropy within each sequence. ``mlp="gated"`` uses a SwiGLU MLP of width
    ``intermediate`` (default ``4 x hidden``)."""

    def __init__(self, vocab: int = 2048, hidden: int = 128, heads: int = 2, layers: int = 2,
                 attention: str = "eager", mlp: str = "gelu", intermediate: int = 0, packing: str = "slices") -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        if mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {mlp!r}")
        if packing not in ("slices", "split"):
            raise ValueError(f"packing must be 'slices' or 'split', got {packing!r}")
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(_Block(hidden, heads, attention, mlp, intermediate, packing) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, lengths)
        logits = self.head(self.norm(x))
        # next-token targets within each sequence; a sequence's last token predicts nothing
        targets = torch.roll(ids, -1)
        ends = torch.tensor(lengths, device=ids.device).cumsum(0) - 1
        targets[ends] = -100
        return F.cross_entropy(logits, targets, ignore_index=-100)


def llama_config(vocab: int, hidden: int, heads: int, layers: int, intermediate: int) -> dict:
    """A Llama-shaped transformers config dict of a ``TinyLM(mlp="gated")`` of these sizes: the
    same linear layers (q, k, v and o projections, no GQA; gate, up and down; the LM head)."""
    return {
        "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": hidden // heads,
        "num_hidden_layers": layers, "tie_word_embeddings": False,
    }


def make_step(model: TinyLM, device: str = "cpu", seed: int = 0) -> Callable[[Sequence[int]], None]:
    """``step(lengths)``: one forward and backward of ``model`` on random tokens of those
    lengths (packed), gradients dropped afterwards."""
    generator = torch.Generator().manual_seed(seed)

    def step(lengths: Sequence[int]) -> None:
        lengths = [int(s) for s in lengths]
        ids = torch.randint(0, model.vocab, (sum(lengths),), generator=generator).to(device)
        model(ids, lengths).backward()
        model.zero_grad(set_to_none=True)

    return step
