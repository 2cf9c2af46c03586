"""A tiny random DeepseekV3ForCausalLM saved with save_pretrained: the stand-in for a download."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 211

# Every feature at once: a query bottleneck, YaRN with both mscales, 8 experts in 4 groups (2 per
# token), 3 experts per token, two shared experts, a dense first layer, renormalised and scaled weights.
FULL: dict[str, Any] = dict(
    q_lora_rank=24, n_group=4, topk_group=2, num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1,
    norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
    rope_parameters={"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                     "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1},
)
# The other side of every switch: no query bottleneck (Moonlight), plain RoPE in the rotate-half
# layout, one group, raw (not renormalised) weights, one shared expert, every layer sparse.
PLAIN: dict[str, Any] = dict(
    q_lora_rank=None, n_group=1, topk_group=1, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=0,
    norm_topk_prob=False, routed_scaling_factor=1.7, rope_interleave=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


def tiny_hf_deepseek(folder: Path, *, seed: int = 0, vocab: int = VOCAB, **overrides: Any) -> Path:
    """Random weights (transformers' init, then perturbed so that norms are not 1 and the router is not
    near-uniform: a wrong map shows in the logits) and a random routing bias, saved in float32."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    kwargs: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=48, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, kv_lora_rank=16, qk_rope_head_dim=8,
        v_head_dim=12, qk_nope_head_dim=10, max_position_embeddings=128, rms_norm_eps=1e-5, num_nextn_predict_layers=0,
        tie_word_embeddings=False,
    )
    kwargs.update(FULL)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**kwargs)).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a trained bias, as published checkpoints hold
                buffer.copy_(torch.randn_like(buffer) * 0.3)
    model.eval().save_pretrained(folder)
    return folder


def reference(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
