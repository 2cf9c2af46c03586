"""Llama 3 presets: tiny debug shapes and the published Llama 3.1 / 3.2 shapes.

``vocab_size=None`` means "the tokenizer's vocabulary" (the core fills it in).
``max_seq_len`` sizes the rotary table only; a run overrides it with its own length.
"""

from __future__ import annotations

from typing import Any

from .model import LlamaArgs, RopeScaling

# Llama 3.1's published scaling (8B / 70B / 405B); Llama 3.2 1B / 3B use factor 32.
_LLAMA31_SCALING = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
_LLAMA32_SCALING = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)



def _debug(**shape: Any) -> LlamaArgs:
    """A debug shape: 6 layers of width 256 with 16 heads, the tokenizer's vocabulary, a 2048 rotary table."""
    return LlamaArgs(**{"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": None, "multiple_of": 256,
                        "rope_theta": 500000.0, "max_seq_len": 2048, **shape})


def _published(scaling: RopeScaling, **shape: Any) -> LlamaArgs:
    """A published Llama 3.1 / 3.2 shape: 8 key/value heads, the 128256-token vocabulary, RoPE theta 500000
    with ``scaling``, a 131072-position rotary table."""
    return LlamaArgs(**{"n_kv_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0, "rope_scaling": scaling,
                        "max_seq_len": 131072, **shape})


llama3_flavors: dict[str, LlamaArgs] = {
    # The shape of the CPU benchmark: 16 heads of 16 channels, plain multi-head attention.
    "debugmodel": _debug(n_kv_heads=16),
    # Same, with 4 key/value heads shared by 4 query heads each.
    "debugmodel_gqa": _debug(n_kv_heads=4),
    # Same, with the output head tied to the embedding (tests of the tie contract).
    "debugmodel_tied": _debug(n_kv_heads=4, tie_embeddings=True),
    # Llama 3.2 1B and 3B as published: tied embeddings, 128256-token vocabulary,
    # 8192-wide MLP; 1,235,814,400 and 3,212,749,824 parameters.
    "1B": _published(_LLAMA32_SCALING, dim=2048, n_layers=16, n_heads=32, intermediate_size=8192,
                     tie_embeddings=True),
    "3B": _published(_LLAMA32_SCALING, dim=3072, n_layers=28, n_heads=24, intermediate_size=8192,
                     tie_embeddings=True),
    # The 1B shape with its own output head and the tokenizer's vocabulary (formerly "1B").
    "1B_untied": _published(_LLAMA32_SCALING, dim=2048, n_layers=16, n_heads=32, vocab_size=None, multiple_of=256,
                            ffn_dim_multiplier=1.5),
    "8B": _published(_LLAMA31_SCALING, dim=4096, n_layers=32, n_heads=32, multiple_of=1024, ffn_dim_multiplier=1.3),
    "70B": _published(_LLAMA31_SCALING, dim=8192, n_layers=80, n_heads=64, multiple_of=4096, ffn_dim_multiplier=1.3),
    "405B": _published(_LLAMA31_SCALING, dim=16384, n_layers=126, n_heads=128, multiple_of=4096,
                       ffn_dim_multiplier=1.2),
}
