"""The deepseek_v3 spec's own config section ``[deepseek_v3]``: model knobs a user may change per run.

A field left ``None`` keeps the flavor's value.
"""

from __future__ import annotations

from pydantic import Field

from titan_core.models.model_parts import DecoderSection


class DeepSeekV3Section(DecoderSection):
    # The shared decoder fields (norm_eps, max_seq_len, rope_theta, n_layers, vocab_size), then its own.

    first_k_dense_replace: int | None = Field(
        None, ge=0, description="MoE flavors: how many of the first layers keep a dense MLP (Hugging Face's "
        "first_k_dense_replace; default: the flavor's).")
    routed_scaling_factor: float | None = Field(
        None, gt=0, description="MoE flavors: the routed experts' weights are multiplied by it (default: the "
        "flavor's).")
    moe_aux_loss_coeff: float | None = Field(
        None, ge=0, description="MoE flavors: coefficient of the sequence-wise auxiliary load-balancing loss added "
        "to the training loss (0: none; default: the flavor's).")
    moe_bias_update_rate: float | None = Field(
        None, ge=0, description="MoE flavors: rate of the auxiliary-loss-free routing-bias update after each optimizer "
        "step: each expert's score bias moves by rate x log(mean load / its load); 0: off; default: the flavor's.")
    mtp_layers: int | None = Field(
        None, ge=0, le=1, description="Multi-token prediction depth: 1 adds DeepSeek-V3's prediction block (layer "
        "n_layers, as its checkpoints hold it), trained to predict the token after next; 0: off (default: the "
        "flavor's, or the Hugging Face config's num_nextn_predict_layers). Not with tp, pp or cp > 1.")
    mtp_loss_weight: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="Weight of the multi-token-prediction loss added to the training "
        "loss (DeepSeek-V3's lambda: 0.3 for most of its run, then 0.1; default: the flavor's). The reported loss "
        "stays the main cross-entropy; mtp_loss is logged beside it.")
