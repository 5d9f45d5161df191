"""seqbal.workload_from_config: exact forward FLOPs of a sequence from a transformers config.

Coefficients are checked by hand (the arithmetic written out in each test), and against
torch's own FLOP counter on the transformers model built from the same config (random weights,
nothing downloaded), which counts every matrix product the forward pass runs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import seqbal
from seqbal import build_dp_schedule, workload_from_config
from seqbal.workload_config import config_flops

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=100)


def test_llama_dict_by_hand():
    w = workload_from_config(SMALL)
    # per layer: q 64x64, k 64x32, v 64x32, o 64x64 (head_dim 16, 2 kv heads) = 12,288 MACs;
    # gated MLP 3 x 64 x 96 = 18,432 MACs; 2 layers, 2 FLOPs per MAC:
    linear = 2 * 2 * (12_288 + 18_432)
    head = 2 * 64 * 100
    pairs = 2 * 2 * 4 * (16 + 16)  # 2 layers x 4 heads x (QK^T + PV) x 2 FLOPs, per pair
    assert w.coefficients == {"per_sequence": 0, "per_token": linear + head + pairs // 2,
                              "per_token_squared": pairs // 2}
    assert w.coefficients["per_token"] == 135_936 and w.coefficients["per_token_squared"] == 256
    assert w.unit == 256
    assert w([1, 1000]).tolist() == [(135_936 + 256) // 256, (135_936_000 + 256_000_000) // 256]
    assert w([1000]).dtype == np.int64
    full = workload_from_config(SMALL, causal=False)
    assert full.coefficients == {"per_sequence": 0, "per_token": linear + head, "per_token_squared": pairs}


def test_objects_and_dicts_agree_and_json_round_trips(tmp_path):
    transformers = pytest.importorskip("transformers")
    for config in (transformers.LlamaConfig(**SMALL), transformers.Qwen2Config(**SMALL)):
        assert workload_from_config(config) == workload_from_config(json.loads(config.to_json_string()))
        path = tmp_path / "config.json"
        config.to_json_file(str(path))
        assert workload_from_config(json.loads(path.read_text())) == workload_from_config(SMALL)


def test_qwen3_explicit_head_dim_by_hand():
    transformers = pytest.importorskip("transformers")
    w = workload_from_config(transformers.Qwen3Config(**SMALL, head_dim=32))
    # q 64 -> 4 x 32 = 128, k and v 64 -> 2 x 32 = 64 each, o 128 -> 64: 64 x 32 x (8 + 4) = 24,576 MACs
    projections = 2 * 2 * 24_576
    mlp = 2 * 2 * 3 * 64 * 96
    pairs = 2 * 2 * 4 * (32 + 32)
    assert w.coefficients["per_token"] == projections + mlp + 2 * 64 * 100 + pairs // 2
    assert w.coefficients["per_token_squared"] == pairs // 2 == 512


def test_qwen3_moe_by_hand():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(**SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[1])
    parts = config_flops(config)
    assert parts.moe_layers == 1
    # layer 0: router 64 x 8, two active experts of 3 x 64 x 48; layer 1 (mlp_only): dense 3 x 64 x 96
    assert parts.mlp_per_token == 2 * (64 * 8 + 2 * 3 * 64 * 48) + 2 * 3 * 64 * 96
    assert parts.attention_projections_per_token == 2 * 2 * 24_576


def test_qwen2_moe_shared_expert_and_mixtral_by_hand():
    transformers = pytest.importorskip("transformers")
    qwen2 = config_flops(transformers.Qwen2MoeConfig(**SMALL, num_experts=8, num_experts_per_tok=2,
                                                     moe_intermediate_size=48, shared_expert_intermediate_size=80))
    # every layer: router 64 x 8 + 2 experts x 3 x 64 x 48 + shared 3 x 64 x 80 + its gate 64 x 1
    assert qwen2.mlp_per_token == 2 * 2 * (64 * 8 + 2 * 3 * 64 * 48 + 3 * 64 * 80 + 64)
    mixtral = config_flops(transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2))
    assert mixtral.mlp_per_token == 2 * 2 * (64 * 4 + 2 * 3 * 64 * 96) and mixtral.moe_layers == 2


def test_deepseek_style_dict_by_hand():
    config = dict(SMALL, num_hidden_layers=3, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                  n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    parts = config_flops(config)
    # q: 64 -> 24 -> 4 x 12; kv: 64 -> 16 + 4, 16 -> 4 x (8 + 8); o: 4 x 8 -> 64
    per_layer = 64 * 24 + 24 * 48 + 64 * 20 + 16 * 64 + 32 * 64
    assert parts.attention_projections_per_token == 2 * 3 * per_layer
    # layer 0 dense; layers 1, 2: router 64 x 8, 2 experts and 1 shared of 3 x 64 x 32
    assert parts.mlp_per_token == 2 * (3 * 64 * 96 + 2 * (64 * 8 + 3 * 3 * 64 * 32)) and parts.moe_layers == 2
    assert parts.attention_per_token_squared == 2 * 3 * 4 * (12 + 8)


CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 48, "mlp_only_layers": [1]}),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                                     "shared_expert_intermediate_size": 80}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "deepseek_v3": ("DeepseekV3Config", {"num_hidden_layers": 3, "moe_intermediate_size": 32, "n_routed_experts": 8,
                                         "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
                                         "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8,
                                         "qk_rope_head_dim": 4, "v_head_dim": 8, "n_group": 2, "topk_group": 1,
                                         "num_key_value_heads": 4}),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_torchs_flop_counter_on_the_model(name):
    """Eager attention computes every pair (causal=False); the only difference is the rotary
    embedding's frequencies, an outer product computed once per forward (rotary dim x s FLOPs)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    class_name, extra = CONFIGS[name]
    config = getattr(transformers, class_name)(**{**SMALL, **extra})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # a loop the counter sees (grouped kernels are not counted)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    parts = config_flops(config, causal=False)
    rotary = extra.get("qk_rope_head_dim") or extra.get("head_dim") or SMALL["hidden_size"] // SMALL["num_attention_heads"]
    for s in (1, 37):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.randint(0, SMALL["vocab_size"], (1, s)))
        assert counter.get_total_flops() == parts.flops(s) + rotary * s, (name, s)


def test_plans_with_it_and_is_exported_lazily():
    assert "workload_from_config" in seqbal.__all__
    w = workload_from_config(SMALL)
    schedule = build_dp_schedule([3000, 10, 10, 1000, 1000, 1000, 50, 700], 2, 4096, workload_fn=w)
    assert sorted(i for rank in schedule.rank_indices for i in rank) == list(range(8))


def test_missing_or_bad_fields_are_value_errors():
    with pytest.raises(ValueError, match="no 'vocab_size'"):
        workload_from_config({k: v for k, v in SMALL.items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="hidden_size"):
        workload_from_config({**SMALL, "hidden_size": 0})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        workload_from_config({**SMALL, "num_experts": 4})
    with pytest.raises(ValueError, match="beyond this workload's exact range"):
        workload_from_config(SMALL)([2**40])
