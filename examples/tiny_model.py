"""A tiny causal transformer in plain torch, shared by the examples (not part of seqbal).

Two layers, hidden size 32: small enough for a CPU test to run in a second, and real enough
that padding mistakes show up (attention over padded keys, wrong position ids, wrong shift
between logits and targets would all break the examples' equality checks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask[:, None])
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


class TinyCausalLM(nn.Module):
    """Decoder-only LM: token + learned position embeddings, pre-norm blocks, LM head."""

    def __init__(self, vocab: int = 97, hidden: int = 32, layers: int = 2, heads: int = 2, max_len: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab]``. Padding (mask 0) may sit anywhere; it is never attended to.

        A query may attend to a key if the key is not after it and is a real token; every
        query also sees itself, so a padding row is never all-masked (which would give NaN that
        then leaks through ``0 * NaN``). Real tokens never see padding, so their outputs do not
        depend on how much padding a batch carries.
        """
        t = input_ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
        eye = torch.eye(t, dtype=torch.bool, device=input_ids.device)
        allowed = causal[None] & (attention_mask.bool()[:, None, :] | eye[None])
        x = self.embed(input_ids) + self.position(position_ids.clamp(min=0))
        for block in self.blocks:
            x = block(x, allowed)
        return self.head(self.norm(x))
