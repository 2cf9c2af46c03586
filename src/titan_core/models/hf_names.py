"""Model-agnostic pieces of a decoder spec's Hugging Face adapter (``state_dict_adapter``).

The top-level names every Llama-style decoder shares with transformers' ``*ForCausalLM``, and the
two tensor loops of ``to_hf`` / ``from_hf``: each key renamed (and, where a model needs it,
permuted) by the adapter's own ``rename``, with a tied head left to transformers. What is
model-specific (the per-layer name table, RoPE row orders, config.json) stays in the adapter.
Also the per-layer renames of a decoder whose name table is a plain rename (no permutation), the
per-expert files of stacked experts, and the checks of config.json values every adapter makes.
A leaf: imports nothing of titan_core, so an adapter imports it at no cost.
"""

from __future__ import annotations

import abc
import math
import re
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


_NATIVE_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_TOP_BACK = inverse(DECODER_TOP)
# The expert index in plain ASCII digits without leading zeros: "experts.03" or a non-ASCII digit would
# otherwise read as a second copy of expert 3.
_EXPERT_FILE = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(0|[1-9][0-9]*)\.((?:gate|up|down)_proj\.weight)$")
_STACKED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.((?:gate|up|down)_proj\.weight)$")


def hf_layer(key: str) -> tuple[int, str] | None:
    """(layer number, the rest of the name) of a transformers per-layer key ``model.layers.N.<rest>``; else None."""
    match = _HF_LAYER.match(key)
    return None if match is None else (int(match.group(1)), match.group(2))


def _weight_module(key: str) -> str | None:
    """``a.b`` for ``a.b.weight``; ``a.b`` for a stacked experts key ``a.b`` (its own parameter)."""
    if key.endswith(".weight"):
        return key.removesuffix(".weight")
    return key if re.search(r"experts\.w[123]$", key) else None


def renamed_to_hf(key: str, layer_names: Mapping[str, str], *, model: str) -> str:
    """transformers' name of native parameter ``key``: ``layers.N.<module>`` through ``layer_names`` (native
    module -> transformers module), the top-level modules through ``DECODER_TOP``; a KeyError naming ``model``
    when neither knows it. A stacked experts parameter (``moe.experts.w1``) has no ``.weight`` on the native side."""
    match = _NATIVE_LAYER.match(key)
    if match:
        layer, rest = match.groups()
        module = _weight_module(rest)
        if module is not None and module in layer_names:
            return f"model.layers.{layer}.{layer_names[module]}.weight"
    elif key.endswith(".weight") and key.removesuffix(".weight") in DECODER_TOP:
        return f"{DECODER_TOP[key.removesuffix('.weight')]}.weight"
    raise KeyError(f"{key!r} is not a {model} parameter this adapter knows")


def renamed_from_hf(key: str, layer_names: Mapping[str, str], *, model: str) -> str:
    """The native name of transformers tensor ``key``, ``layer_names`` (native module -> transformers module)
    read backwards; a KeyError naming ``model`` when neither it nor ``DECODER_TOP`` knows the name."""
    match = _HF_LAYER.match(key)
    if match:
        layer, module = match.group(1), match.group(2).removesuffix(".weight")
        native = inverse(layer_names).get(module)
        if key.endswith(".weight") and native is not None:
            return f"layers.{layer}.{native}" if native.startswith("moe.experts") else f"layers.{layer}.{native}.weight"
    elif key.endswith(".weight") and key.removesuffix(".weight") in _TOP_BACK:
        return f"{_TOP_BACK[key.removesuffix('.weight')]}.weight"
    raise KeyError(f"{key!r} is not a {model} tensor this adapter knows")


def hf_stacked_expert(hf_key: str) -> tuple[str, int] | None:
    """(stacked name, expert index) of a per-expert file ``model.layers.N.mlp.experts.E.gate_proj.weight``
    (the stacked name drops ``.E``); None for any other key. An adapter's ``hf_stacked_name``."""
    match = _EXPERT_FILE.match(hf_key)
    return None if match is None else (f"{match.group(1)}.{match.group(3)}", int(match.group(2)))


def hf_expert_file(stacked_name: str, index: int) -> str | None:
    """The per-expert file name of expert ``index`` of ``stacked_name``; None for a name that is not stacked
    experts. An adapter's ``hf_expert_name``."""
    match = _STACKED.match(stacked_name)
    return None if match is None else f"{match.group(1)}.{index}.{match.group(2)}"


def describe_model_type(config: Mapping[str, Any]) -> str:
    """How config.json names its model, for a refusal: ``has no model_type`` or ``describes a "x" model (arch)``."""
    model_type = config.get("model_type")
    arch = ", ".join(str(a) for a in config.get("architectures") or []) or "unknown architecture"
    return "has no model_type" if model_type is None else f'describes a "{model_type}" model ({arch})'


def activation_and_bias_problems(config: Mapping[str, Any]) -> list[str]:
    """What config.json asks for that a bias-free SwiGLU decoder cannot be: an activation other than SiLU,
    attention biases."""
    problems: list[str] = []
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f'hidden_act={config["hidden_act"]!r} (only "silu")')
    if config.get("attention_bias"):
        problems.append("attention_bias=true (this model has no biases)")
    return problems


def is_int(value: Any) -> bool:
    """A whole number of config.json (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def finite_number(value: Any) -> bool:
    """A finite number of config.json (a bool is not one). JSON's integers have no bound, and math.isfinite
    raises OverflowError for one beyond any float (a 1 and 400 zeros): that is not finite either."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def positive(value: Any, key: str, problems: list[str]) -> float:
    """``value`` as a float when it is a finite positive number; else a problem named after ``key`` is
    added to ``problems`` and 1.0 stands in (the adapter refuses the config with all its problems)."""
    if finite_number(value) and value > 0:
        return float(value)
    problems.append(f"{key}={value!r} (a positive number)")
    return 1.0


class RenamingAdapter(abc.ABC):
    """The tensor side of a ``state_dict_adapter`` whose every map is a rename (no tensor is permuted, so
    rows stay in order) and whose stacked experts live in per-expert files. A subclass says how each
    name maps (``hf_name``, ``native_name``) and writes config.json (``hf_config``, ``model_args_from_hf``);
    ``model_args`` is the subclass's model-args dataclass, with a ``tie_embeddings`` field."""

    @abc.abstractmethod
    def hf_name(self, key: str, model_args: Any) -> str | None:
        """transformers' name of native parameter ``key``; None: it is not exported. A KeyError for an unknown one."""

    @abc.abstractmethod
    def native_name(self, hf_key: str, model_args: Any) -> str | None:
        """The native name of transformers tensor ``hf_key``; None: it is deliberately not read. A KeyError for an
        unknown one."""

    def to_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: Any) -> dict[str, torch.Tensor]:
        def rename(key: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
            name = self.hf_name(key, model_args)
            return None if name is None else (name, tensor)

        return tensors_to_hf(state_dict, tied=model_args.tie_embeddings, rename=rename)

    def from_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: Any) -> dict[str, torch.Tensor]:
        def rename(key: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
            name = self.native_name(key, model_args)
            return None if name is None else (name, tensor)

        return tensors_from_hf(state_dict, tied=model_args.tie_embeddings, rename=rename)

    def from_hf_rows(self, hf_key: str, hf_shape: tuple[int, ...], model_args: Any) -> None:
        """Every map is a rename: rows stay in order (each rank reads only its own rows)."""
        self.native_name(hf_key, model_args)  # a KeyError for a name this adapter does not know
        return None

    # ---- per-expert files <-> stacked experts (titan_core.hf.stacks) ----------------------------
    def hf_stacked_name(self, hf_key: str) -> tuple[str, int] | None:
        return hf_stacked_expert(hf_key)

    def hf_expert_name(self, stacked_name: str, index: int) -> str | None:
        return hf_expert_file(stacked_name, index)
