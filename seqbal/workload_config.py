"""A workload from the model: FLOPs of one sequence, from a transformers config.

``workload_from_config(config)`` counts the multiply-adds (two FLOPs each) of a decoder-only
transformer's forward pass on one sequence of ``s`` tokens: every linear layer (attention
projections with grouped-query attention or DeepSeek's multi-head latent attention; a dense
gated MLP, or a mixture of experts with its router, the experts each token is routed to and the
shared experts; the LM head) costs a fixed number of FLOPs per token, and attention's scores and
weighted values cost a number per pair of tokens of the sequence. So the count is exactly
``per_token * s + per_token_squared * s**2``, integers; a :class:`~seqbal.quadratic_workload.QuadraticWorkload`
with those coefficients is the ``workload_fn`` every planner takes. The backward pass costs
twice the forward in the same proportions, so the forward count balances a training step too.

What is counted, and why: matrix products only (norms, activations, softmax, rotary embeddings
and bias adds are a few FLOPs per element, under 1% at any realistic width, and their time is
memory-bound, not FLOPs-bound; embedding look-ups cost none). Attention is causal by default:
a kernel that skips masked blocks (flash attention, varlen) computes ``s (s + 1) / 2`` pairs per
head, which adds ``(s**2 + s) / 2`` pairs' FLOPs; ``causal=False`` counts every ``s**2`` pair,
as eager and math attention compute them. Sliding-window attention is not modelled (the count
is of full causal attention).

Field names read (of the config object, or of a ``config.json`` dict; a ``text_config``
inside, as multimodal models have, is used when present): ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (default: the heads),
``head_dim`` (default ``hidden_size // num_attention_heads``), ``intermediate_size``,
``vocab_size``; mixture of experts: ``num_experts`` / ``num_local_experts`` /
``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size`` (default
``intermediate_size``), ``shared_expert_intermediate_size`` (Qwen2-MoE, with its one-output
gate), ``n_shared_experts`` (DeepSeek), ``decoder_sparse_step`` and ``mlp_only_layers`` (Qwen),
``first_k_dense_replace`` and ``moe_layer_freq`` (DeepSeek); latent attention: ``kv_lora_rank``,
``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``. NumPy only: no
transformers import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .quadratic_workload import QuadraticWorkload
from .validation import int_argument

__all__ = ["workload_from_config", "ConfigFlops", "config_flops"]

_MISSING = object()


def _reader(config: Any):
    if isinstance(config, Mapping):
        data = config
        if isinstance(data.get("text_config"), Mapping):
            data = data["text_config"]

        def get(name: str, default: Any = _MISSING) -> Any:
            value = data.get(name, None)
            return default if value is None else value
        return get
    inner = getattr(config, "text_config", None)
    if inner is not None and not isinstance(inner, (str, int, float)) and hasattr(inner, "hidden_size"):
        config = inner

    def get(name: str, default: Any = _MISSING) -> Any:
        value = getattr(config, name, None)
        return default if value is None else value
    return get


def _int(get: Any, name: str, default: Any = _MISSING, minimum: int = 1) -> int:
    value = get(name, default)
    if value is _MISSING:
        raise ValueError(f"the config has no {name!r}: workload_from_config needs it (a transformers decoder config "
                         f"or its config.json dict)")
    return int_argument(name, value, minimum=minimum, expected=f"an int >= {minimum}")


@dataclass(frozen=True)
class ConfigFlops:
    """Forward FLOPs of one sequence, by part: every count is per token (``*_per_token``) or per
    token pair (``attention_per_token_squared``), summed over layers.

    Attributes:
        attention_projections_per_token: q, k, v and output projections (latent attention's
            down- and up-projections).
        mlp_per_token: dense MLPs, and for experts: the routers, the routed experts each token
            runs, the shared experts and their gates.
        lm_head_per_token: the LM head (``2 * hidden_size * vocab_size``).
        attention_per_token_squared: scores and weighted values per token pair,
            ``2 * heads * (qk_head_dim + v_head_dim)`` per layer (``causal`` halves the pairs).
        causal: whether only the causal pairs are counted (``s (s + 1) / 2`` per head).
        moe_layers: how many layers are mixtures of experts.
    """

    attention_projections_per_token: int
    mlp_per_token: int
    lm_head_per_token: int
    attention_per_token_squared: int
    causal: bool
    moe_layers: int

    @property
    def per_token(self) -> int:
        """FLOPs per token: the linear layers, plus the diagonal half of causal attention."""
        diagonal = self.attention_per_token_squared // 2 if self.causal else 0
        return self.attention_projections_per_token + self.mlp_per_token + self.lm_head_per_token + diagonal

    @property
    def per_token_squared(self) -> int:
        """FLOPs per squared token: attention (halved when causal)."""
        return self.attention_per_token_squared // 2 if self.causal else self.attention_per_token_squared

    def flops(self, length: int) -> int:
        """Exact forward FLOPs of one sequence of ``length`` tokens (a Python int)."""
        return self.per_token * length + self.per_token_squared * length * length


def config_flops(config: Any, *, causal: bool = True) -> ConfigFlops:
    """The FLOPs of one sequence by part (:class:`ConfigFlops`); :func:`workload_from_config`
    is this as a ``workload_fn``. O(layers)."""
    get = _reader(config)
    hidden = _int(get, "hidden_size")
    layers = _int(get, "num_hidden_layers")
    heads = _int(get, "num_attention_heads")
    vocab = _int(get, "vocab_size")
    if get("kv_lora_rank", None) is not None:  # multi-head latent attention (DeepSeek-V2/V3)
        kv_rank = _int(get, "kv_lora_rank")
        q_rank = get("q_lora_rank", None)
        nope, rope, v_dim = _int(get, "qk_nope_head_dim"), _int(get, "qk_rope_head_dim", 0, 0), _int(get, "v_head_dim")
        qk_dim = nope + rope
        q = hidden * heads * qk_dim if q_rank is None else hidden * int(q_rank) + int(q_rank) * heads * qk_dim
        projections = q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        kv_heads = _int(get, "num_key_value_heads", heads)
        head_dim = _int(get, "head_dim", hidden // heads)
        qk_dim = v_dim = head_dim
        projections = hidden * head_dim * (2 * heads + 2 * kv_heads)
    dense = _int(get, "intermediate_size")
    experts = get("num_experts", None) or get("num_local_experts", None) or get("n_routed_experts", None)
    experts = 0 if experts is None else int_argument("num_experts", experts, minimum=0, expected="an int >= 0")
    moe = 0
    mlp = 0
    if experts:
        active = _int(get, "num_experts_per_tok")
        expert_size = _int(get, "moe_intermediate_size", dense)
        shared = 0
        if get("shared_expert_intermediate_size", None):  # Qwen2-MoE: one shared expert and a 1-output gate
            shared = 3 * hidden * _int(get, "shared_expert_intermediate_size") + hidden
        elif get("n_shared_experts", None):  # DeepSeek: n shared experts of the routed size
            shared = 3 * hidden * expert_size * _int(get, "n_shared_experts")
        moe_mac = hidden * experts + 3 * hidden * expert_size * active + shared
        only_dense = set(get("mlp_only_layers", []) or [])
        step = _int(get, "decoder_sparse_step", 1)
        first_dense = _int(get, "first_k_dense_replace", 0, 0)
        frequency = _int(get, "moe_layer_freq", 1)
        for layer in range(layers):
            is_moe = (layer not in only_dense and (layer + 1) % step == 0  # Qwen's rule
                      and layer >= first_dense and layer % frequency == 0)  # DeepSeek's rule
            moe += is_moe
            mlp += moe_mac if is_moe else 3 * hidden * dense
    else:
        mlp = layers * 3 * hidden * dense
    return ConfigFlops(
        attention_projections_per_token=2 * layers * projections,
        mlp_per_token=2 * mlp,
        lm_head_per_token=2 * hidden * vocab,
        attention_per_token_squared=2 * layers * heads * (qk_dim + v_dim),
        causal=bool(causal),
        moe_layers=moe,
    )


def workload_from_config(config: Any, *, causal: bool = True) -> QuadraticWorkload:
    """The ``workload_fn`` of a transformers model: forward FLOPs of each sequence, exact.

    Args:
        config: a transformers config object (``LlamaConfig``, ``Qwen3MoeConfig``, ...) or the
            dict of its ``config.json``. Fields read: module docstring.
        causal: count only the causal pairs of attention (flash and varlen kernels; default) or
            every pair (eager and math attention).

    Returns:
        A :class:`~seqbal.quadratic_workload.QuadraticWorkload`: lengths -> int64 workloads,
        the FLOPs divided by ``.unit``; ``.coefficients`` are the exact FLOPs per token and per
        squared token. Pass it as ``workload_fn=``.

    Raises:
        ValueError: a field it needs is missing or not a positive int.

    Complexity: O(layers) once; O(n) per call.

    Examples:
        >>> w = workload_from_config({"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
        ...                           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100})
        >>> w.coefficients  # 2 layers x (24,576 projections + 61,440 MLP) + 12,800 head + 256 diagonal
        {'per_sequence': 0, 'per_token': 185088, 'per_token_squared': 256}
        >>> w([1000]).tolist(), w.unit  # (185,088,000 + 256,000,000) / 256
        ([1723000], 256)
    """
    flops = config_flops(config, causal=causal)
    return QuadraticWorkload(0, flops.per_token, flops.per_token_squared, what="forward FLOPs")
