"""The llama3 spec's own config section: model knobs a user may change per run.

A field left ``None`` keeps the flavor's value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LlamaSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    norm_eps: float | None = Field(None, gt=0, description="RMSNorm epsilon (default: the flavor's).")
    max_seq_len: int | None = Field(None, gt=0, description="Longest sequence the RoPE table covers (default: the flavor's).")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base frequency (default: the flavor's).")
    n_layers: int | None = Field(None, gt=0, description="Number of transformer blocks (default: the flavor's).")
    vocab_size: int | None = Field(None, gt=0, description="Vocabulary size (default: the flavor's, or the tokenizer's).")
    attention_kernel: Literal["auto", "sdpa"] | None = Field(
        None, description="auto: the fused CPU attention kernel for float32 CPU runs with 16/32/64-channel heads, "
        "SDPA elsewhere; sdpa: always torch's scaled_dot_product_attention (default: auto).")
