"""Epochs over a map-style dataset: a token-budget batch sampler and offline packing into rows.

A trainer that iterates a fixed dataset (SFT: transformers' ``Trainer``, TRL, axolotl,
LLaMA-Factory's classic trainer) reads the number of batches once and takes exactly that many in
every epoch. :class:`TokenBudgetBatchSampler` fixes that count when it is built and draws a fresh
mix of samples at it every epoch; :func:`pack_rows` plans rows of a packed dataset once. Both
plan from the global lengths on every rank, with no collective but the one small all-reduce that
proves every rank planned from the same inputs (:mod:`.agreement`).

Modules: :mod:`.sampler` (the sampler and ``pack_rows``), :mod:`.agreement` (the proof that
every rank's inputs are the same). The trainers' adapters in :mod:`seqbal.integrations` build on
these; they hold only the glue to each trainer.
"""

from __future__ import annotations

from .sampler import DRAWS, FRESH_COUNT_SLACK, TokenBudgetBatchSampler, pack_rows

__all__ = ["TokenBudgetBatchSampler", "pack_rows", "FRESH_COUNT_SLACK", "DRAWS"]
