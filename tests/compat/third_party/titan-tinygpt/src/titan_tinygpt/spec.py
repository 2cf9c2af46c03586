"""The tinygpt TrainSpec: what the ``titan.train_specs`` entry point ``tinygpt`` names.

A minimal spec names its model and flavors; everything else here is optional.
Parallelism is titan-core's default parallelize_fn (TP -> activation
checkpointing -> compile -> FSDP2) driven by this model's TP plan. The loss, tokenizer, data loader, optimizer, LR schedule and
metrics all come from titan-core's defaults, because no ``build_*`` field is set.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from titan_core import TrainSpec

from .model import TinyGPT, TinyGPTArgs, flops_per_token
from .tp_plan import tinygpt_tp_plan
from .validate import validate_tinygpt


class TinyGPTSection(BaseModel):
    """The ``[tinygpt]`` config section: a field left None keeps the flavor's value."""

    model_config = ConfigDict(extra="forbid")

    n_layers: int | None = Field(None, gt=0, description="Number of transformer blocks (default: the flavor's).")
    max_seq_len: int | None = Field(None, gt=0, description="Longest sequence the position embedding covers (default: the flavor's).")
    norm_eps: float | None = Field(None, gt=0, description="LayerNorm epsilon (default: the flavor's).")


# vocab_size=None: titan-core fills it from the tokenizer the run uses.
flavors: dict[str, TinyGPTArgs] = {
    "debugmodel": TinyGPTArgs(dim=64, n_layers=2, n_heads=4, vocab_size=None, max_seq_len=512),
    "small": TinyGPTArgs(dim=768, n_layers=12, n_heads=12, vocab_size=None, max_seq_len=1024),
}

tinygpt_spec = TrainSpec(
    name="tinygpt",
    model_cls=TinyGPT,
    flavors=flavors,
    tp_plan_fn=tinygpt_tp_plan,
    # Per-op selective checkpointing: keep every other matmul and the attention output.
    selective_ac_save_ops=("aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                           "aten._scaled_dot_product_flash_attention.default",
                           "aten._scaled_dot_product_efficient_attention.default"),
    config_model=TinyGPTSection,
    validate_fn=validate_tinygpt,
    flops_per_token_fn=flops_per_token,
    plugin_api_version="1.0",  # the titan-core plugin API this spec was written for
)
