"""The llama3 spec's own config section: model knobs a user may change per run.

A field left ``None`` keeps the flavor's value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from titan_core.models.model_parts import DecoderSection


class LlamaSection(DecoderSection):
    # The shared decoder fields (norm_eps, max_seq_len, rope_theta, n_layers, vocab_size), then its own.

    attention_kernel: Literal["auto", "fused", "sdpa"] | None = Field(
        None, description="auto: the fused CPU attention kernel for float32 CPU runs with 16/32/64-channel heads "
        "where it is the faster (packed documents, or a CPU with AVX-512), SDPA elsewhere; fused: that kernel "
        "wherever it applies; sdpa: always torch's scaled_dot_product_attention (default: auto).")
