"""The qwen3 spec's own config section ``[qwen3]``: model knobs a user may change per run.

A field left ``None`` keeps the flavor's value.
"""

from __future__ import annotations

from pydantic import Field, StrictInt

from titan_core.models.model_parts import DecoderSection


class Qwen3Section(DecoderSection):
    # The shared decoder fields (norm_eps, max_seq_len, rope_theta, n_layers, vocab_size), then its own.

    # StrictInt: a layer id written as true or 1.0 is a mistake, not layer 1.
    mlp_only_layers: tuple[StrictInt, ...] | None = Field(
        None, description="MoE flavors: layer ids that keep a dense MLP instead of experts, e.g. [0] (Hugging Face's "
        "mlp_only_layers; default: the flavor's).")
    decoder_sparse_step: int | None = Field(
        None, ge=1, description="MoE flavors: every n-th layer is sparse (Hugging Face's decoder_sparse_step; default: "
        "the flavor's).")
    moe_aux_loss_coeff: float | None = Field(
        None, ge=0, le=1, description="MoE flavors: coefficient of the auxiliary load-balancing loss added to the "
        "training loss, 0 to 1 (0: none; above 1 balancing would outweigh the language-model loss; default: the flavor's).")
    moe_bias_update_rate: float | None = Field(
        None, ge=0, le=1, description="MoE flavors: rate of the auxiliary-loss-free routing-bias update after each "
        "optimizer step (DeepSeek-V3), 0 to 1: each expert's logit bias moves by rate x log(mean load / its load); 0: "
        "off; default: the flavor's.")
