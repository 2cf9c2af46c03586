"""The deepseek_v3 spec's Hugging Face adapter: ``DeepseekV3ForCausalLM``.

Names: ``tok_embeddings`` <-> ``model.embed_tokens``, ``norm`` <-> ``model.norm``, ``output`` <->
``lm_head``; per layer ``attention.wq`` (or ``wq_a``, ``q_norm``, ``wq_b``), ``wkv_a``, ``kv_norm``,
``wkv_b``, ``wo`` <-> ``self_attn.q_proj`` (or ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``),
``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``; ``attention_norm`` /
``ffn_norm`` <-> ``input_layernorm`` / ``post_attention_layernorm``; ``feed_forward.w1/w3/w2`` and
``moe.shared_experts.w1/w3/w2`` <-> ``mlp.gate_proj/up_proj/down_proj`` and
``mlp.shared_experts.*``; ``moe.router.gate`` <-> ``mlp.gate``; ``moe.router.expert_bias`` ->
``mlp.gate.e_score_correction_bias``. Every map is a rename: the model rotates in transformers'
(interleaved) layout, so no tensor is permuted, and a round trip is bit for bit.

Experts: the model stacks them (``moe.experts.w1`` is [experts, hidden, dim]); checkpoints hold one
tensor per expert (``mlp.experts.E.gate_proj.weight``), read and written through the core's
stacking (``hf_stacked_name`` / ``hf_expert_name``, ``titan_core.hf.stacks``).

The routing bias (a persistent buffer) goes both ways: transformers routes with it, and the
published checkpoints hold a trained one.

Multi-token prediction: a checkpoint holds its block as one more layer (``model.layers.61`` in
DeepSeek-V3, ``num_nextn_predict_layers: 1``), which the model builds as ``layers.<n_layers>``: the
block's names as any layer's, plus ``enorm``, ``hnorm``, ``eh_proj`` and ``shared_head.norm``. That
layer also holds copies of the embedding and the head (``embed_tokens``, ``shared_head.head``):
they are not read (the model shares the main ones) and are written from the main ones. A
checkpoint's prediction layers beyond the model's are not read. A folder's prediction layer is read
only when the run asks for it (``--deepseek_v3.mtp_layers=1``): ``num_nextn_predict_layers`` in
config.json cannot tell, since transformers writes 1 there and saves no prediction layer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from titan_core import ConfigError
from titan_core.models import hf_names

from .model import DeepSeekV3Args

_LAYER = {
    "attention.wq": "self_attn.q_proj",
    "attention.wq_a": "self_attn.q_a_proj",
    "attention.q_norm": "self_attn.q_a_layernorm",
    "attention.wq_b": "self_attn.q_b_proj",
    "attention.wkv_a": "self_attn.kv_a_proj_with_mqa",
    "attention.kv_norm": "self_attn.kv_a_layernorm",
    "attention.wkv_b": "self_attn.kv_b_proj",
    "attention.wo": "self_attn.o_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "moe.shared_experts.w1": "mlp.shared_experts.gate_proj",
    "moe.shared_experts.w3": "mlp.shared_experts.up_proj",
    "moe.shared_experts.w2": "mlp.shared_experts.down_proj",
    "moe.router.gate": "mlp.gate",
    "moe.experts.w1": "mlp.experts.gate_proj",
    "moe.experts.w3": "mlp.experts.up_proj",
    "moe.experts.w2": "mlp.experts.down_proj",
    # the multi-token-prediction layer's own modules, named alike on both sides
    "enorm": "enorm",
    "hnorm": "hnorm",
    "eh_proj": "eh_proj",
    "shared_head.norm": "shared_head.norm",
}
# The multi-token-prediction layer's copies of the main embedding and head: its name -> the main one.
_MTP_COPIES = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
_BIAS = re.compile(r"^layers\.(\d+)\.moe\.router\.expert_bias$")
_HF_BIAS = "mlp.gate.e_score_correction_bias"
_MODEL = "DeepSeek-V3"  # as the KeyError for an unknown name says it


class DeepSeekV3StateDictAdapter(hf_names.RenamingAdapter):
    """``TrainSpec.state_dict_adapter`` of the deepseek_v3 spec (the protocol in titan_core.hf): the tensor
    loops, row maps and per-expert files are ``RenamingAdapter``'s, the names and config.json DeepSeek-V3's."""

    # mtp_layers too: config.json's num_nextn_predict_layers cannot say whether the folder holds the prediction
    # layer (transformers writes 1 and saves none), so the model builds it only when the run asks for it.
    runtime_fields: tuple[str, ...] = ("max_seq_len", "moe_aux_loss_coeff", "moe_bias_update_rate", "mtp_layers",
                                       "mtp_loss_weight")

    # ---- tensor names ------------------------------------------------------------------------------
    def hf_name(self, key: str, model_args: DeepSeekV3Args) -> str:
        bias = _BIAS.match(key)
        return f"model.layers.{bias.group(1)}.{_HF_BIAS}" if bias else hf_names.renamed_to_hf(key, _LAYER, model=_MODEL)

    def native_name(self, hf_key: str, model_args: DeepSeekV3Args) -> str | None:
        """None for a tensor that is deliberately not read: a prediction layer the model does not build, and
        the prediction layer's copies of the embedding and the head."""
        layer = hf_names.hf_layer(hf_key)
        if layer is not None and layer[0] >= model_args.n_layers:
            if layer[0] >= model_args.n_layers + model_args.mtp_layers or layer[1] in _MTP_COPIES:
                return None
        if layer is not None and layer[1] == _HF_BIAS:
            return f"layers.{layer[0]}.moe.router.expert_bias"
        return hf_names.renamed_from_hf(hf_key, _LAYER, model=_MODEL)

    def to_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: DeepSeekV3Args) -> dict[str, torch.Tensor]:
        """The renamed tensors, and with multi-token prediction the prediction layer's copies of the embedding
        and the head, as DeepSeek-V3's checkpoint holds them (copies: a file may not hold one tensor twice)."""
        out = super().to_hf(state_dict, model_args)
        if model_args.mtp_layers:
            copies = dict(_MTP_COPIES)
            if model_args.tie_embeddings:  # the head is the embedding table
                copies["shared_head.head.weight"] = "model.embed_tokens.weight"
            for rest, main in copies.items():
                if main in out:
                    out[f"model.layers.{model_args.n_layers}.{rest}"] = out[main].clone()
        return out

    # ---- config.json -----------------------------------------------------------------------------
    def hf_config(self, model_args: DeepSeekV3Args) -> dict[str, Any]:
        a = model_args
        if a.score_func != "sigmoid":
            raise ConfigError(f"this deepseek_v3 model routes with score_func={a.score_func!r}; DeepseekV3ForCausalLM "
                              f"routes with sigmoid scores only. Export it as a titan checkpoint instead.")
        rope: dict[str, Any] = {"rope_type": a.rope_type, "rope_theta": a.rope_theta}
        if a.rope_type == "yarn":
            rope.update({"factor": a.rope_factor, "original_max_position_embeddings": a.rope_original_max_seq_len,
                         "beta_fast": a.rope_beta_fast, "beta_slow": a.rope_beta_slow, "truncate": a.rope_truncate})
            for key, value in (("mscale", a.rope_mscale), ("mscale_all_dim", a.rope_mscale_all_dim),
                               ("attention_factor", a.rope_attention_factor)):
                if value:
                    rope[key] = value
        legacy = None if a.rope_type == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
        # An all-dense model is written with experts that no layer uses (transformers' fields need values).
        experts = a.n_routed_experts
        return hf_names.decoder_config(
            architecture="DeepseekV3ForCausalLM", model_type="deepseek_v3", dim=a.dim, n_layers=a.n_layers,
            n_heads=a.n_heads, n_kv_heads=a.n_heads, head_dim=a.qk_rope_head_dim,
            intermediate_size=a.intermediate_size, vocab_size=a.vocab_size, norm_eps=a.norm_eps,
            max_seq_len=a.max_seq_len, tie_embeddings=a.tie_embeddings, rope=rope, rope_scaling=legacy,
            q_lora_rank=a.q_lora_rank or None, kv_lora_rank=a.kv_lora_rank, qk_nope_head_dim=a.qk_nope_head_dim,
            qk_rope_head_dim=a.qk_rope_head_dim, v_head_dim=a.v_head_dim, rope_interleave=a.rope_interleave,
            n_routed_experts=experts or a.num_experts_per_tok, num_experts_per_tok=a.num_experts_per_tok,
            moe_intermediate_size=a.moe_intermediate_size, n_shared_experts=a.n_shared_experts,
            first_k_dense_replace=a.first_k_dense_replace if experts else a.n_layers, n_group=a.n_group,
            topk_group=a.topk_group, routed_scaling_factor=a.routed_scaling_factor, norm_topk_prob=a.norm_topk_prob,
            num_nextn_predict_layers=a.mtp_layers,
        )

    def model_args_from_hf(self, config: Mapping[str, Any]) -> DeepSeekV3Args:
        model_type = config.get("model_type")
        if model_type != "deepseek_v3":
            raise ConfigError(f'config.json {hf_names.describe_model_type(config)}, not a DeepSeek-V3: the deepseek_v3 '
                              f'spec reads model_type "deepseek_v3" (DeepseekV3ForCausalLM) only. Pick the spec that '
                              f'matches the checkpoint.')
        if "n_routed_experts" not in config and "num_local_experts" in config:
            config = {**config, "n_routed_experts": config["num_local_experts"]}
        c = {**_DEFAULTS, **{k: v for k, v in config.items() if v is not None or k == "q_lora_rank"}}
        problems: list[str] = []
        for key in _SHAPE:
            if not hf_names.is_int(c.get(key)) or c[key] < 1:
                problems.append(f"{key}={c.get(key)!r} (a whole number of 1 or more)")
        for key in ("n_shared_experts", "first_k_dense_replace"):
            if not hf_names.is_int(c.get(key)) or c[key] < 0:
                problems.append(f"{key}={c.get(key)!r} (a whole number of 0 or more)")
        q_lora = c.get("q_lora_rank")
        if q_lora is not None and (not hf_names.is_int(q_lora) or q_lora < 1):
            problems.append(f"q_lora_rank={q_lora!r} (null or a whole number of 1 or more)")
        problems += [f"{k}={c[k]} (more than {limit:,})" for k, limit in _LIMITS.items()
                     if hf_names.is_int(c.get(k)) and c[k] > limit]
        problems += hf_names.activation_and_bias_problems(c)
        if hf_names.is_int(c.get("qk_rope_head_dim")) and c["qk_rope_head_dim"] % 2:
            problems.append(f"qk_rope_head_dim={c['qk_rope_head_dim']} (an even number: rotary channels come in pairs)")
        for key in ("tie_word_embeddings", "norm_topk_prob", "rope_interleave"):
            if not isinstance(c.get(key), bool):
                problems.append(f"{key}={c.get(key)!r} (true or false)")
        eps = hf_names.positive(c.get("rms_norm_eps"), "rms_norm_eps", problems)
        scaling = hf_names.positive(c.get("routed_scaling_factor"), "routed_scaling_factor", problems)
        max_len: int = c["max_position_embeddings"]
        if not hf_names.is_int(max_len) or not 1 <= max_len <= 10**7:
            problems.append(f"max_position_embeddings={max_len!r} (a whole number from 1 to 10,000,000)")
            max_len = 4096
        rope = _rope_fields(config, max_len, problems)
        if problems:
            raise ConfigError("config.json sets what the deepseek_v3 spec cannot express: " + "; ".join(problems) + ".")
        # Every layer dense (first_k_dense_replace >= layers): no experts at all, and the MoE fields, which
        # transformers' config carries whatever the layers are (and hf_config writes for a dense model), are
        # not read: a dense model takes the defaults, which DeepSeekV3Args requires of a dense shape.
        sparse = c["first_k_dense_replace"] < c["num_hidden_layers"]
        moe: dict[str, Any] = dict(
            n_routed_experts=c["n_routed_experts"], num_experts_per_tok=c["num_experts_per_tok"],
            moe_intermediate_size=c["moe_intermediate_size"], n_shared_experts=c["n_shared_experts"],
            first_k_dense_replace=c["first_k_dense_replace"], n_group=c["n_group"], topk_group=c["topk_group"],
            routed_scaling_factor=scaling, norm_topk_prob=c["norm_topk_prob"]) if sparse else {}
        try:
            return DeepSeekV3Args(
                dim=c["hidden_size"], n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
                vocab_size=c["vocab_size"], intermediate_size=c["intermediate_size"], norm_eps=eps, max_seq_len=max_len,
                tie_embeddings=c["tie_word_embeddings"], q_lora_rank=q_lora or 0, kv_lora_rank=c["kv_lora_rank"],
                qk_nope_head_dim=c["qk_nope_head_dim"], qk_rope_head_dim=c["qk_rope_head_dim"],
                v_head_dim=c["v_head_dim"], rope_interleave=c["rope_interleave"], **rope, **moe,
            )
        except (ValueError, ArithmeticError) as exc:
            raise ConfigError(f"config.json describes a shape the deepseek_v3 model cannot take: {exc}") from None


# transformers' DeepseekV3Config defaults, for fields a config.json leaves out.
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "rope_interleave": True, "rope_theta": 10000.0,
}
_SHAPE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
          "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
          "num_experts_per_tok", "moe_intermediate_size", "n_group", "topk_group")
# Bounds no real checkpoint comes near, checked before a (meta) model is built.
_LIMITS = {"hidden_size": 2**17, "num_hidden_layers": 4096, "num_attention_heads": 4096, "intermediate_size": 2**20,
           "vocab_size": 2**24, "n_routed_experts": 4096, "moe_intermediate_size": 2**20, "kv_lora_rank": 2**16,
           "q_lora_rank": 2**16, "n_shared_experts": 4096,
           # the head sizes too: 2**62 passed, and building the model failed in torch's own code
           "qk_nope_head_dim": 2**16, "qk_rope_head_dim": 2**16, "v_head_dim": 2**16}


def _rope_fields(config: Mapping[str, Any], max_len: int, problems: list[str]) -> dict[str, Any]:
    """The model's rope_* fields from rope_parameters (transformers 5) or rope_scaling / rope_theta (4.x)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        problems.append(f"rope_parameters={rope!r} (an object)")
        return {}
    theta = hf_names.positive(rope.get("rope_theta", config.get("rope_theta", 10000.0)), "rope_theta", problems)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("default", None):
        return {"rope_theta": theta}
    if kind != "yarn":
        problems.append(f"a {kind!r} RoPE scaling (only plain RoPE and yarn)")
        return {}
    original = rope.get("original_max_position_embeddings", max_len)
    # bounded as max_position_embeddings is: a 1 and 400 zeros was converted, and ended titan-generate on the
    # folder (the rotary table takes its logarithm as a float) with an OverflowError traceback
    if not hf_names.is_int(original) or not 1 <= original <= 10**7:
        problems.append(f"original_max_position_embeddings={original!r} (a whole number from 1 to 10,000,000)")
        original = max_len
    factor = rope.get("factor")
    # transformers: without a factor, the ratio of the context to the original one.
    factor = hf_names.positive(max_len / original if factor is None else factor, "rope factor", problems)
    fields: dict[str, Any] = {"rope_theta": theta, "rope_type": "yarn", "rope_factor": factor,
                              "rope_original_max_seq_len": original,
                              "rope_truncate": rope.get("truncate", True)}
    # An explicit value is used or refused, never replaced: transformers' `get("beta_fast") or 32` read a
    # beta_fast of 0 (yarn divides by it) as 32, a model other than the file's.
    for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        value = rope.get(key)
        fields[f"rope_{key}"] = default if value is None else hf_names.positive(value, key, problems)
    if not isinstance(fields["rope_truncate"], bool):  # bool() read the string "false" as true
        problems.append(f"truncate={fields['rope_truncate']!r} (true or false)")
    for key, field in (("mscale", "rope_mscale"), ("mscale_all_dim", "rope_mscale_all_dim")):
        value = rope.get(key)
        if value is None:
            continue
        # 0 means unset here, as transformers reads it (`if mscale and mscale_all_dim`); a negative one is refused.
        if hf_names.finite_number(value) and value >= 0:
            fields[field] = float(value)
        else:
            problems.append(f"{key}={value!r} (0 or a positive number)")
    # transformers uses an explicit attention_factor as given (0 would zero the rotary table): refused, not
    # derived as if it were absent.
    if rope.get("attention_factor") is not None:
        fields["rope_attention_factor"] = hf_names.positive(rope["attention_factor"], "attention_factor", problems)
    return fields
