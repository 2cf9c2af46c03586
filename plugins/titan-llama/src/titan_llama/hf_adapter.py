"""The llama3 spec's Hugging Face adapter: ``LlamaForCausalLM`` names, RoPE row order, config.json.

Names: ``tok_embeddings`` <-> ``model.embed_tokens``, ``layers.N.attention.wq/wk/wv/wo``
<-> ``model.layers.N.self_attn.q_proj/k_proj/v_proj/o_proj``, ``feed_forward.w1/w3/w2`` <->
``mlp.gate_proj/up_proj/down_proj``, ``attention_norm``/``ffn_norm`` <->
``input_layernorm``/``post_attention_layernorm``, ``norm`` <-> ``model.norm``, ``output`` <->
``lm_head``.

RoPE row order: this model rotates consecutive channel pairs (2i, 2i+1) of each head,
transformers rotates channel i with channel i + head_dim/2 ("rotate half"). The two give
the same attention scores when the rows of each head of ``wq``/``wk`` are permuted:
HF row i is our row 2i, HF row i + head_dim/2 is our row 2i+1.

Every map is key-wise (one tensor in, one out), as the core's protocol requires, and a
tied head is left out of the Hugging Face side (transformers ties ``lm_head`` itself).
``from_hf`` is a row gather for every key (``from_hf_rows`` gives the rows), so each rank
reads only its own slice of each tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from titan_core import ConfigError
from titan_core.models.hf_names import (
    DECODER_TOP,
    decoder_config,
    finite_number,
    inverse,
    tensors_from_hf,
    tensors_to_hf,
)

from .model import LlamaArgs, RopeScaling

_LAYER = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP = DECODER_TOP
_NATIVE_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.weight$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
_LAYER_BACK = inverse(_LAYER)
_TOP_BACK = inverse(_TOP)
_NATIVE_QK = ("attention.wq", "attention.wk")  # the projections whose rows RoPE's layout orders
_HF_QK = ("self_attn.q_proj", "self_attn.k_proj")


def _heads_to_rotate_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Our interleaved rows -> transformers' rotate-half rows, per head."""
    rows, cols = w.shape
    head_dim = rows // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _heads_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = w.shape
    head_dim = rows // n_heads
    return w.reshape(n_heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def _rename(key: str, layer_pattern: re.Pattern[str], layer_prefix: str, layer_names: Mapping[str, str],
            top_names: Mapping[str, str]) -> tuple[str, str]:
    """(the other side's name, the module path it was found under) for one ``*.weight`` key."""
    match = layer_pattern.match(key)
    if match:
        layer, module = match.groups()
        if module in layer_names:
            return f"{layer_prefix}.{layer}.{layer_names[module]}.weight", module
    else:
        module = key.removesuffix(".weight")
        if key.endswith(".weight") and module in top_names:
            return f"{top_names[module]}.weight", module
    raise KeyError(f"{key!r} is not a Llama parameter this adapter knows")


def _permute_heads(w: torch.Tensor, module: str, q_k: tuple[str, str], args: LlamaArgs,
                   permute: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """``permute`` over the heads of ``w`` when ``module`` is the query or key projection (``q_k``, as
    named on this side); any other module's tensor unchanged."""
    if module not in q_k:
        return w
    return permute(w, args.n_heads if module == q_k[0] else args.kv_heads)


class LlamaStateDictAdapter:
    """``TrainSpec.state_dict_adapter`` of the llama3 spec (the protocol in titan_core.hf)."""

    runtime_fields: tuple[str, ...] = ("max_seq_len", "attention_kernel")

    # ---- tensors -------------------------------------------------------------------------------
    def to_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: LlamaArgs) -> dict[str, torch.Tensor]:
        def rename(key: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
            name, module = _rename(key, _NATIVE_LAYER, "model.layers", _LAYER, _TOP)
            return name, _permute_heads(tensor, module, _NATIVE_QK, model_args, _heads_to_rotate_half)

        return tensors_to_hf(state_dict, tied=model_args.tie_embeddings, rename=rename)

    def from_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: LlamaArgs) -> dict[str, torch.Tensor]:
        def rename(key: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
            name, module = _rename(key, _HF_LAYER, "layers", _LAYER_BACK, _TOP_BACK)
            return name, _permute_heads(tensor, module, _HF_QK, model_args, _heads_to_interleaved)

        return tensors_from_hf(state_dict, tied=model_args.tie_embeddings, rename=rename)

    def from_hf_rows(self, hf_key: str, hf_shape: tuple[int, ...], model_args: LlamaArgs) -> torch.Tensor | None:
        """Native row i of ``from_hf``'s tensor for ``hf_key`` is HF row ``rows[i]`` (None: a rename).

        The core uses it to read only a rank's own rows (and columns) of each tensor.
        """
        _, module = _rename(hf_key, _HF_LAYER, "layers", _LAYER_BACK, _TOP_BACK)
        if module not in _HF_QK:
            return None
        # The same per-head permutation as from_hf, applied to the row numbers.
        rows = torch.arange(hf_shape[0]).unsqueeze(1)
        return _permute_heads(rows, module, _HF_QK, model_args, _heads_to_interleaved).squeeze(1)

    # ---- config.json -----------------------------------------------------------------------------
    def hf_config(self, model_args: LlamaArgs) -> dict[str, Any]:
        a = model_args
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": a.rope_theta}
        if a.rope_scaling is not None:
            s = a.rope_scaling
            rope = {"rope_type": "llama3", "rope_theta": a.rope_theta, "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_position_embeddings}
        legacy_scaling = None if a.rope_scaling is None else {k: v for k, v in rope.items() if k != "rope_theta"}
        return decoder_config(
            architecture="LlamaForCausalLM", model_type="llama", dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads,
            n_kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate_size=a.ffn_hidden_dim, vocab_size=a.vocab_size,
            norm_eps=a.norm_eps, max_seq_len=a.max_seq_len, tie_embeddings=a.tie_embeddings, rope=rope,
            rope_scaling=legacy_scaling, mlp_bias=False,
        )

    def model_args_from_hf(self, config: Mapping[str, Any]) -> LlamaArgs:
        model_type = config.get("model_type")
        if model_type != "llama":
            arch = ", ".join(str(a) for a in config.get("architectures") or []) or "unknown architecture"
            said = "has no model_type" if model_type is None else f'describes a "{model_type}" model ({arch})'
            raise ConfigError(
                f'config.json {said}, not a Llama: the llama3 spec reads model_type "llama" (LlamaForCausalLM) '
                f"only. Pick the spec that matches the checkpoint."
            )
        problems: list[str] = []
        missing = [k for k in _SHAPE_FIELDS if not _is_int(config.get(k))]
        if missing:
            raise ConfigError(f"config.json lacks the integer field(s) {', '.join(missing)} that give the model's "
                              f"shape (found {', '.join(f'{k}={config.get(k)!r}' for k in missing)}).")
        problems += [f"{k}={config[k]} (must be 1 or more)" for k in _SHAPE_FIELDS if config[k] < 1]
        problems += [f"{k}={config[k]} (more than {limit:,}: {why})" for k, (limit, why) in _LIMITS.items()
                     if _is_int(config.get(k)) and config[k] > limit]
        if config.get("hidden_act", "silu") != "silu":
            problems.append(f'hidden_act={config["hidden_act"]!r} (only "silu")')
        for flag in ("attention_bias", "mlp_bias"):
            if config.get(flag):
                problems.append(f"{flag}=true (this model has no biases)")
        dim, heads = config["hidden_size"], config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads")
        if kv_heads is None:
            kv_heads = heads  # transformers' default: multi-head attention
        elif not _is_int(kv_heads) or kv_heads < 1:
            problems.append(f"num_key_value_heads={kv_heads!r} (a whole number of 1 or more, or leave it out)")
        head_dim = config.get("head_dim")
        if not problems:  # the divisibility checks need every count valid
            problems += _head_problems(dim, heads, kv_heads, head_dim)
        scaling, theta = _rope(config, problems)
        eps = _positive_number(config, "rms_norm_eps", 1e-6, problems)
        max_len = config.get("max_position_embeddings", 2048)
        if not _is_int(max_len) or max_len < 1:
            problems.append(f"max_position_embeddings={max_len!r} (a whole number of 1 or more)")
        tie = config.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            problems.append(f"tie_word_embeddings={tie!r} (true or false)")
        if problems:
            raise ConfigError("config.json sets what the llama3 spec cannot express: " + "; ".join(problems) + ".")
        try:
            return LlamaArgs(
                dim=dim, n_layers=config["num_hidden_layers"], n_heads=heads, n_kv_heads=kv_heads,
                vocab_size=config["vocab_size"], intermediate_size=config["intermediate_size"], norm_eps=eps,
                rope_theta=theta, rope_scaling=scaling, max_seq_len=max_len, tie_embeddings=tie,
            )
        except (ValueError, ArithmeticError) as exc:
            raise ConfigError(f"config.json describes a shape the llama3 model cannot take: {exc}") from None


_SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# Bounds no real checkpoint comes near, checked before a model is built: even a meta model of 10^5
# layers takes minutes to build, a size past int64 is a TypeError deep in torch, and the RoPE
# table (max_position_embeddings rows) is allocated in full.
_DAMAGED = "no real checkpoint is that large; config.json is damaged"
_LIMITS = {
    "num_hidden_layers": (1024, _DAMAGED),
    "hidden_size": (2**31 - 1, _DAMAGED),
    "num_attention_heads": (2**31 - 1, _DAMAGED),
    "intermediate_size": (2**31 - 1, _DAMAGED),
    "vocab_size": (2**31 - 1, _DAMAGED),
    "max_position_embeddings": (2**24, "the RoPE table holds every position and would not fit; lower it in "
                                        "config.json"),
}


def _is_int(value: Any) -> bool:
    """A JSON whole number: ``true`` is an int to Python but never a count of layers."""
    return isinstance(value, int) and not isinstance(value, bool)


def _head_problems(dim: int, heads: int, kv_heads: int, head_dim: Any) -> list[str]:
    """What is wrong with the head counts, in config.json's names (LlamaArgs would name its own fields)."""
    problems: list[str] = []
    if head_dim is not None and (not _is_int(head_dim) or head_dim * heads != dim):
        problems.append(f"head_dim={head_dim!r} with hidden_size={dim}, num_attention_heads={heads} "
                        f"(head_dim must be hidden_size / num_attention_heads)")
    elif dim % heads:
        problems.append(f"hidden_size={dim} is not a multiple of num_attention_heads={heads}")
    if heads % kv_heads:
        problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    return problems


def _positive_number(config: Mapping[str, Any], key: str, default: float, problems: list[str]) -> float:
    """``config[key]`` as a finite positive float; a problem naming the field otherwise."""
    value = config.get(key, default)
    if finite_number(value) and value > 0:  # an integer beyond any float is not finite
        return float(value)
    problems.append(f"{key}={value!r} (a positive number)")
    return default


def _rope(config: Mapping[str, Any], problems: list[str]) -> tuple[RopeScaling | None, float]:
    """(the llama3 RoPE scaling or None, rope_theta) from rope_parameters (transformers 5) or rope_scaling (4.x)."""
    field = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = config.get(field) or {}
    if not isinstance(rope, Mapping):
        problems.append(f"{field}={rope!r} (an object such as {{\"rope_type\": \"llama3\", ...}}, or null)")
        rope = {}
    theta = _positive_number({"rope_theta": rope.get("rope_theta", config.get("rope_theta", 10000.0))},
                             "rope_theta", 10000.0, problems)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None, theta
    if rope_type != "llama3":
        problems.append(f'rope_type={rope_type!r} (supported: "llama3", or none)')
        return None, theta
    absent = [k for k in _LLAMA3_ROPE if k not in rope]
    if absent:
        problems.append(f"rope scaling of type llama3 lacks {', '.join(absent)}")
        return None, theta
    before = len(problems)
    values = {k: _positive_number(rope, k, 1.0, problems) for k in _LLAMA3_ROPE}
    if len(problems) > before:
        problems[before:] = [f"{field}.{p}" for p in problems[before:]]
        return None, theta
    original = values["original_max_position_embeddings"]
    if original != int(original):
        problems.append(f"{field}.original_max_position_embeddings={original!r} (a whole number)")
        return None, theta
    return RopeScaling(factor=values["factor"], low_freq_factor=values["low_freq_factor"],
                       high_freq_factor=values["high_freq_factor"],
                       original_max_position_embeddings=int(original)), theta


_LLAMA3_ROPE = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
