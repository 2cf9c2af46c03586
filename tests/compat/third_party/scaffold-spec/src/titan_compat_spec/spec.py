"""The compat_spec TrainSpec: what the ``titan.train_specs`` entry point ``compat_spec`` names.

Only the model, its flavors and a TP plan: parallelism is titan-core's default
parallelize_fn (TP -> activation checkpointing -> compile -> FSDP2), and the loss,
tokenizer, data, optimizer, LR schedule and metrics are the core's defaults.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from titan_core import ConfigError, ParallelismSection, TrainingSection, TrainSpec

from .model import CompatSpecArgs, CompatSpecModel, flops_per_token
from .tp_plan import compat_spec_tp_plan


class CompatSpecSection(BaseModel):
    """The ``[compat_spec]`` config section: a field left None keeps the flavor's value."""

    model_config = ConfigDict(extra="forbid")

    n_layers: int | None = Field(None, gt=0, description="Number of blocks (default: the flavor's).")


flavors: dict[str, CompatSpecArgs] = {
    "debugmodel": CompatSpecArgs(dim=64, n_layers=2, n_heads=4, hidden=256),
    "small": CompatSpecArgs(dim=768, n_layers=12, n_heads=12, hidden=3072),
}


def validate_compat_spec(args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int) -> None:
    """Refuse layouts the model cannot take, before any process starts."""
    del training, world_size
    for what, value in (("n_heads", args.n_heads), ("hidden", args.hidden)):
        if value % parallelism.tp:
            raise ConfigError(f"parallelism.tp={parallelism.tp} does not divide compat_spec {what}={value}; "
                              f"choose a tp degree that divides it.")


compat_spec_spec = TrainSpec(
    name="compat_spec",
    model_cls=CompatSpecModel,
    flavors=flavors,
    tp_plan_fn=compat_spec_tp_plan,
    # Per-op selective activation checkpointing keeps these outputs (every other matmul).
    selective_ac_save_ops=("aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                           "aten._scaled_dot_product_flash_attention.default",
                           "aten._scaled_dot_product_efficient_attention.default"),
    config_model=CompatSpecSection,
    validate_fn=validate_compat_spec,
    flops_per_token_fn=flops_per_token,
    plugin_api_version="1.0",  # the titan-core plugin API this spec was written for
)
