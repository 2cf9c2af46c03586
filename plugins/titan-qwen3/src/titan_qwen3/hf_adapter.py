"""The qwen3 spec's Hugging Face adapter: ``Qwen3ForCausalLM`` and ``Qwen3MoeForCausalLM``.

Names: ``tok_embeddings`` <-> ``model.embed_tokens``, ``layers.N.attention.wq/wk/wv/wo`` <->
``model.layers.N.self_attn.q_proj/k_proj/v_proj/o_proj``, ``attention.q_norm/k_norm`` <->
``self_attn.q_norm/k_norm``, ``attention_norm``/``ffn_norm`` <-> ``input_layernorm``/
``post_attention_layernorm``, ``feed_forward.w1/w3/w2`` <-> ``mlp.gate_proj/up_proj/down_proj``,
``moe.router.gate`` <-> ``mlp.gate``, ``norm`` <-> ``model.norm``, ``output`` <-> ``lm_head``.

Experts: the model stacks them (``moe.experts.w1`` is [experts, hidden, dim]); the published
checkpoints hold one tensor per expert (``mlp.experts.E.gate_proj.weight``). The tensor maps
work on the stacked name ``mlp.experts.gate_proj.weight`` (the per-expert name without its
index), and ``hf_stacked_name`` / ``hf_expert_name`` tell the core how to read and write
the per-expert files (``titan_core.hf.stacks``). Both sides use the "rotate half" RoPE
layout, so no tensor is permuted: every map is a rename.

``moe.router.expert_bias`` (the routing bias of auxiliary-loss-free balancing) is training
state with no Hugging Face counterpart: it is not exported, and starts at zero on load.
Shared experts have no place in ``Qwen3MoeForCausalLM``, so a model with them is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from titan_core import ConfigError
from titan_core.models import hf_names

from .model import Qwen3Args

_LAYER = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "attention.q_norm": "self_attn.q_norm",
    "attention.k_norm": "self_attn.k_norm",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "moe.router.gate": "mlp.gate",
    "moe.experts.w1": "mlp.experts.gate_proj",
    "moe.experts.w3": "mlp.experts.up_proj",
    "moe.experts.w2": "mlp.experts.down_proj",
}
_NOT_EXPORTED = re.compile(r"^layers\.\d+\.moe\.router\.expert_bias$")


class Qwen3StateDictAdapter(hf_names.RenamingAdapter):
    """``TrainSpec.state_dict_adapter`` of the qwen3 spec (the protocol in titan_core.hf): the tensor loops,
    row maps and per-expert files are ``RenamingAdapter``'s, the names and config.json are Qwen3's."""

    runtime_fields: tuple[str, ...] = ("max_seq_len", "moe_aux_loss_coeff", "moe_bias_update_rate")

    # ---- tensor names ------------------------------------------------------------------------------
    def hf_name(self, key: str, model_args: Qwen3Args) -> str | None:
        return None if _NOT_EXPORTED.match(key) else hf_names.renamed_to_hf(key, _LAYER, model="Qwen3")

    def native_name(self, hf_key: str, model_args: Qwen3Args) -> str:
        return hf_names.renamed_from_hf(hf_key, _LAYER, model="Qwen3 / Qwen3-MoE")

    # ---- config.json -----------------------------------------------------------------------------
    def hf_config(self, model_args: Qwen3Args) -> dict[str, Any]:
        a = model_args
        config = hf_names.decoder_config(
            architecture="Qwen3ForCausalLM", model_type="qwen3", dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads,
            n_kv_heads=a.n_kv_heads, head_dim=a.head_dim, intermediate_size=a.intermediate_size,
            vocab_size=a.vocab_size, norm_eps=a.norm_eps, max_seq_len=a.max_seq_len, tie_embeddings=a.tie_embeddings,
            rope={"rope_type": "default", "rope_theta": a.rope_theta}, rope_scaling=None,
            use_sliding_window=False, sliding_window=None,
        )
        if a.num_experts:
            if a.shared_expert_intermediate_size:
                raise ConfigError(
                    f"this qwen3 model has shared experts (shared_expert_intermediate_size="
                    f"{a.shared_expert_intermediate_size}), which Qwen3MoeForCausalLM cannot hold; export it as a "
                    f"titan checkpoint (--checkpoint.export_format=safetensors) instead."
                )
            config.update({
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "num_experts": a.num_experts,
                "num_experts_per_tok": a.num_experts_per_tok,
                "moe_intermediate_size": a.moe_intermediate_size,
                "norm_topk_prob": a.norm_topk_prob,
                "decoder_sparse_step": a.decoder_sparse_step,
                "mlp_only_layers": list(a.mlp_only_layers),
                "router_aux_loss_coef": a.moe_aux_loss_coeff,
                "output_router_logits": False,
            })
        return config

    def model_args_from_hf(self, config: Mapping[str, Any]) -> Qwen3Args:
        model_type = config.get("model_type")
        if model_type not in ("qwen3", "qwen3_moe"):
            raise ConfigError(
                f'config.json {hf_names.describe_model_type(config)}, not a Qwen3: the qwen3 spec reads model_type '
                f'"qwen3" (Qwen3ForCausalLM) and "qwen3_moe" (Qwen3MoeForCausalLM) only. Pick the spec that matches '
                f'the checkpoint.'
            )
        moe = model_type == "qwen3_moe"
        if moe and "num_experts" not in config and "num_local_experts" in config:
            config = {**config, "num_experts": config["num_local_experts"]}  # transformers 5's spelling
        shape = _SHAPE + (_MOE_SHAPE if moe else ())
        missing = [k for k in shape if not hf_names.is_int(config.get(k))]
        if missing:
            raise ConfigError(f"config.json lacks the integer field(s) {', '.join(missing)} that give the model's "
                              f"shape (found {', '.join(f'{k}={config.get(k)!r}' for k in missing)}).")
        problems = [f"{k}={config[k]} (must be 1 or more)" for k in shape if config[k] < 1]
        problems += [f"{k}={config[k]} (more than {limit:,})" for k, limit in _LIMITS.items()
                     if hf_names.is_int(config.get(k)) and config[k] > limit]
        problems += hf_names.activation_and_bias_problems(config)
        if config.get("use_sliding_window"):
            problems.append("use_sliding_window=true (this model attends to the whole causal context)")
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads", heads)
        if not hf_names.is_int(kv_heads) or kv_heads < 1:
            problems.append(f"num_key_value_heads={kv_heads!r} (a whole number of 1 or more)")
        elif not problems and heads % kv_heads:
            problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads else 0)
        # bounded as the other sizes are: 2**62 passed, and building the model failed in torch's own code
        if not hf_names.is_int(head_dim) or not 2 <= head_dim <= _MAX_HEAD_DIM or head_dim % 2:
            problems.append(f"head_dim={head_dim!r} (an even whole number up to {_MAX_HEAD_DIM:,})")
        theta = hf_names.positive(_rope_theta(config), "rope_theta", problems)
        eps = hf_names.positive(config.get("rms_norm_eps", 1e-6), "rms_norm_eps", problems)
        max_len = config.get("max_position_embeddings", 40960)
        if not hf_names.is_int(max_len) or not 1 <= max_len <= 10**7:
            problems.append(f"max_position_embeddings={max_len!r} (a whole number from 1 to 10,000,000)")
        tie = config.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            problems.append(f"tie_word_embeddings={tie!r} (true or false)")
        moe_fields: dict[str, Any] = {}
        if moe:
            moe_fields = _moe_fields(config, problems)
        if problems:
            raise ConfigError("config.json sets what the qwen3 spec cannot express: " + "; ".join(problems) + ".")
        try:
            return Qwen3Args(
                dim=config["hidden_size"], n_layers=config["num_hidden_layers"], n_heads=heads, n_kv_heads=kv_heads,
                head_dim=head_dim, vocab_size=config["vocab_size"], intermediate_size=config["intermediate_size"],
                norm_eps=eps, rope_theta=theta, max_seq_len=max_len, tie_embeddings=tie, **moe_fields,
            )
        except (ValueError, ArithmeticError) as exc:
            raise ConfigError(f"config.json describes a shape the qwen3 model cannot take: {exc}") from None


_SHAPE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
_MOE_SHAPE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
# Bounds no real checkpoint comes near, checked before a (meta) model is built.
_LIMITS = {"hidden_size": 2**17, "num_hidden_layers": 4096, "num_attention_heads": 4096, "intermediate_size": 2**20,
           "vocab_size": 2**24, "num_experts": 4096, "moe_intermediate_size": 2**20}
_MAX_HEAD_DIM = 2**16


def _rope_theta(config: Mapping[str, Any]) -> Any:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(rope, Mapping) and rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        return f"a {rope.get('rope_type', rope.get('type'))!r} scaling (only plain RoPE)"
    return (rope.get("rope_theta") if isinstance(rope, Mapping) else None) or config.get("rope_theta", 1000000.0)


def _moe_fields(config: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    experts, top_k = config["num_experts"], config["num_experts_per_tok"]
    if hf_names.is_int(experts) and hf_names.is_int(top_k) and top_k > experts:
        problems.append(f"num_experts_per_tok={top_k} is more than num_experts={experts}")
    step = config.get("decoder_sparse_step", 1)
    if not hf_names.is_int(step) or step < 1:
        problems.append(f"decoder_sparse_step={step!r} (a whole number of 1 or more)")
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(hf_names.is_int(i) and i >= 0 for i in dense):
        problems.append(f"mlp_only_layers={dense!r} (a list of layer numbers)")
        dense = []
    norm = config.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        problems.append(f"norm_topk_prob={norm!r} (true or false)")
    if config.get("shared_expert_intermediate_size"):
        problems.append("shared_expert_intermediate_size (Qwen3-MoE has no shared experts)")
    return {"num_experts": experts, "num_experts_per_tok": top_k,
            "moe_intermediate_size": config["moe_intermediate_size"], "norm_topk_prob": norm,
            "decoder_sparse_step": step, "mlp_only_layers": tuple(dense)}
