"""The ops Llama's per-op selective activation checkpointing saves (names only: importing this is cheap)."""

from __future__ import annotations

SDPA_OPS: tuple[str, ...] = (
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
)
# The fused CPU attention kernel (cpu_attention.py): this model's attention where SDPA is not used.
FUSED_ATTENTION = "titan_llama.causal_attention.default"

# Every other matmul and every attention output are kept; the rest is recomputed.
LLAMA_SELECTIVE_SAVE_OPS: tuple[str, ...] = ("aten.mm.default", *SDPA_OPS, FUSED_ATTENTION)
