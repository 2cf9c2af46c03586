"""DeepSeek-V3 presets: tiny debug shapes and the published DeepSeek-V3 / Moonlight shapes.

``vocab_size=None`` means "the tokenizer's vocabulary" (the core fills it in).
``max_seq_len`` sizes the rotary table only; a run overrides it with its own length.
The published shapes are those of the models' config.json files; tests/deepseek checks
their parameter counts against the published totals. Neither includes the multi-token
prediction module (DeepSeek-V3's checkpoint holds it as an extra layer 61); a run adds it with
``--deepseek_v3.mtp_layers=1``.
"""

from __future__ import annotations

from .model import DeepSeekV3Args

deepseek_v3_flavors: dict[str, DeepSeekV3Args] = {
    # Dense MLPs, multi-head latent attention with a query bottleneck: the attention in seconds.
    "debugmodel": DeepSeekV3Args(
        dim=256, n_layers=4, n_heads=8, vocab_size=None, intermediate_size=512, max_seq_len=2048,
        q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
    ),
    # Every feature, small: one dense layer first, 16 experts in 4 groups (2 groups per token),
    # 2 of them per token, one shared expert, sigmoid scores renormalised and scaled, the
    # routing-bias update and the sequence-wise auxiliary loss (together they hold the load within
    # 1.3 x even over 200 steps on every seed tried; either alone does not: docs/benchmarks.md),
    # YaRN (4x over a 512-token original context), the query bottleneck.
    "debugmoe": DeepSeekV3Args(
        dim=256, n_layers=4, n_heads=8, vocab_size=None, intermediate_size=512, max_seq_len=2048,
        q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        rope_type="yarn", rope_factor=4.0, rope_original_max_seq_len=512, rope_mscale=1.0, rope_mscale_all_dim=1.0,
        n_routed_experts=16, num_experts_per_tok=2, moe_intermediate_size=128, n_shared_experts=1,
        first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5, moe_bias_update_rate=0.01,
        moe_aux_loss_coeff=0.02,
    ),
    # deepseek-ai/DeepSeek-V3 (and V3-0324, R1): 671B parameters, 37B active.
    "671B": DeepSeekV3Args(
        dim=7168, n_layers=61, n_heads=128, vocab_size=129280, intermediate_size=18432, norm_eps=1e-6,
        max_seq_len=163840, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, rope_theta=10000.0, rope_type="yarn", rope_factor=40.0, rope_original_max_seq_len=4096,
        rope_beta_fast=32.0, rope_beta_slow=1.0, rope_mscale=1.0, rope_mscale_all_dim=1.0,
        n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, n_shared_experts=1,
        first_k_dense_replace=3, n_group=8, topk_group=4, routed_scaling_factor=2.5,
    ),
    # moonshotai/Moonlight-16B-A3B: 16B parameters, 3B active; no query bottleneck, no groups.
    "Moonlight-16B-A3B": DeepSeekV3Args(
        dim=2048, n_layers=27, n_heads=16, vocab_size=163840, intermediate_size=11264, norm_eps=1e-5,
        max_seq_len=8192, q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, rope_theta=50000.0, n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408,
        n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.446,
    ),
}
