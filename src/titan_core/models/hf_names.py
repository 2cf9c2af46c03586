"""Model-agnostic pieces of a decoder spec's Hugging Face adapter (``state_dict_adapter``).

The top-level names every Llama-style decoder shares with transformers' ``*ForCausalLM``, and the
two tensor loops of ``to_hf`` / ``from_hf``: each key renamed (and, where a model needs it,
permuted) by the adapter's own ``rename``, with a tied head left to transformers. What is
model-specific (the per-layer name table, RoPE row orders, config.json) stays in the adapter.
A leaf: imports nothing of titan_core, so an adapter imports it at no cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

# Native name -> transformers' name, for the modules outside the layers.
DECODER_TOP: Mapping[str, str] = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}

# One tensor in, its new name and tensor out; None: the tensor has no counterpart and is left out.
Rename = Callable[[str, torch.Tensor], "tuple[str, torch.Tensor] | None"]


def inverse(table: Mapping[str, str]) -> dict[str, str]:
    """The name table read the other way (transformers' name -> native name)."""
    return {v: k for k, v in table.items()}


def tensors_to_hf(state_dict: Mapping[str, torch.Tensor], *, tied: bool, rename: Rename) -> dict[str, torch.Tensor]:
    """``to_hf``: every native tensor through ``rename``; a tied ``output.weight`` is left out
    (transformers ties lm_head to embed_tokens from config.json)."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if key == "output.weight" and tied:
            continue
        renamed = rename(key, tensor)
        if renamed is not None:
            out[renamed[0]] = renamed[1]
    return out


def tensors_from_hf(state_dict: Mapping[str, torch.Tensor], *, tied: bool, rename: Rename) -> dict[str, torch.Tensor]:
    """``from_hf``: every transformers tensor through ``rename``, except ``rotary_emb.inv_freq`` (a buffer
    some exports carry, recomputed from the config) and, tied, ``lm_head.weight`` (some tied exports
    still carry it: the embedding is the source)."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if key.endswith("rotary_emb.inv_freq") or (key == "lm_head.weight" and tied):
            continue
        renamed = rename(key, tensor)
        if renamed is not None:
            out[renamed[0]] = renamed[1]
    return out


def decoder_config(*, architecture: str, model_type: str, dim: int, n_layers: int, n_heads: int, n_kv_heads: int,
                   head_dim: int, intermediate_size: int, vocab_size: int | None, norm_eps: float, max_seq_len: int,
                   tie_embeddings: bool, rope: dict[str, Any], rope_scaling: dict[str, Any] | None,
                   **extra: Any) -> dict[str, Any]:
    """The config.json of a bias-free SwiGLU decoder with RMSNorm (transformers' Llama-style ``*ForCausalLM``);
    ``rope`` is transformers 5's ``rope_parameters``, ``rope_scaling`` 4.x's spelling of the same (both are
    written, so either version reads it); ``extra`` keys (the model's own) go before ``use_cache``."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": dim,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate_size,
        "vocab_size": vocab_size,
        "rms_norm_eps": norm_eps,
        "max_position_embeddings": max_seq_len,
        "tie_word_embeddings": tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "rope_parameters": rope,
        "rope_theta": rope["rope_theta"],
        "rope_scaling": rope_scaling,
        **extra,
        "use_cache": True,
    }
