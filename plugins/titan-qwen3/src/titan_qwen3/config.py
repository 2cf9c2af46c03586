"""The qwen3 spec's own config section ``[qwen3]``: model knobs a user may change per run.

A field left ``None`` keeps the flavor's value.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Qwen3Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    norm_eps: float | None = Field(None, gt=0, description="RMSNorm epsilon (default: the flavor's).")
    max_seq_len: int | None = Field(None, gt=0, description="Longest sequence the RoPE table covers (default: the flavor's).")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base frequency (default: the flavor's).")
    n_layers: int | None = Field(None, gt=0, description="Number of transformer blocks (default: the flavor's).")
    vocab_size: int | None = Field(None, gt=0, description="Vocabulary size (default: the flavor's, or the tokenizer's).")
    mlp_only_layers: tuple[int, ...] | None = Field(
        None, description="MoE flavors: layer ids that keep a dense MLP instead of experts, e.g. [0] (Hugging Face's "
        "mlp_only_layers; default: the flavor's).")
    decoder_sparse_step: int | None = Field(
        None, ge=1, description="MoE flavors: every n-th layer is sparse (Hugging Face's decoder_sparse_step; default: "
        "the flavor's).")
    moe_aux_loss_coeff: float | None = Field(
        None, ge=0, description="MoE flavors: coefficient of the auxiliary load-balancing loss added to the training "
        "loss (0: none; default: the flavor's).")
    moe_bias_update_rate: float | None = Field(
        None, ge=0, description="MoE flavors: rate of the auxiliary-loss-free routing-bias update after each optimizer "
        "step (DeepSeek-V3): each expert's logit bias moves by rate x log(mean load / its load); 0: off; default: the "
        "flavor's.")
