"""Qwen3 presets: tiny debug shapes and the published Qwen3 / Qwen3-MoE shapes.

``vocab_size=None`` means "the tokenizer's vocabulary" (the core fills it in).
``max_seq_len`` sizes the rotary table only; a run overrides it with its own length.
The published shapes are those of the models' config.json files (151936-token vocabulary,
head_dim 128, rope_theta 1e6, RMSNorm eps 1e-6); tests/qwen3 checks their parameter counts
against the published totals.
"""

from __future__ import annotations

from dataclasses import replace

from .model import Qwen3Args

# What every published Qwen3 shares; each flavor replaces the rest.
_QWEN3 = Qwen3Args(vocab_size=151936, head_dim=128, rope_theta=1000000.0, norm_eps=1e-6, max_seq_len=40960)

qwen3_flavors: dict[str, Qwen3Args] = {
    # Dense, small enough for CPU tests: 8 query heads sharing 4 key/value heads.
    "debugmodel": Qwen3Args(
        dim=256, n_layers=6, n_heads=8, n_kv_heads=4, head_dim=32, vocab_size=None, intermediate_size=512,
        max_seq_len=2048,
    ),
    # MoE: 8 experts, 2 per token, each expert half the debugmodel's MLP, so the active MLP
    # width equals debugmodel's (the benchmark compares the two). Balanced by the routing-bias
    # update (DeepSeek-V3), no auxiliary loss; rate 0.1: see docs/benchmarks.md (MoE load balance).
    "debugmoe": Qwen3Args(
        dim=256, n_layers=6, n_heads=8, n_kv_heads=4, head_dim=32, vocab_size=None, intermediate_size=512,
        max_seq_len=2048, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
        moe_bias_update_rate=0.1,
    ),
    "0.6B": replace(_QWEN3, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, intermediate_size=3072,
                    tie_embeddings=True),
    "1.7B": replace(_QWEN3, dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, intermediate_size=6144,
                    tie_embeddings=True),
    "4B": replace(_QWEN3, dim=2560, n_layers=36, n_heads=32, n_kv_heads=8, intermediate_size=9728,
                    tie_embeddings=True),
    "8B": replace(_QWEN3, dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, intermediate_size=12288),
    "30B-A3B": replace(_QWEN3, dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, intermediate_size=6144,
                    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    "235B-A22B": replace(_QWEN3, dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, intermediate_size=12288,
                    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536),
}
