"""``tiny``: the core's own small decoder, the model converters are checked against by default.

Importing this module registers the spec (``--import titan_core.testing.tiny_spec``),
so subprocess runs of the conformance kit find it without any installed model plugin.
It uses only the core's defaults: ``default_parallelize_fn`` with the scaffold's TP plan.
"""

from __future__ import annotations

from ..plugin.discovery import register_train_spec
from ..plugin.protocols import TrainSpec

# The model and TP plan that ``titan-plugin new spec`` writes into a new package (scaffold/): one
# decoder serves both, so what the kit checks converters against is what an author starts from.
from ..scaffold.tiny_model import TinyArgs, TinyModel, flops_per_token as matmul_flops_per_token
from ..scaffold.tiny_tp_plan import tiny_tp_plan

TinyTransformer = TinyModel  # the name the tests and the docs know it by

__all__ = ["TINY_SPEC", "TinyArgs", "TinyTransformer", "matmul_flops_per_token", "tiny_tp_plan"]

TINY_SPEC = TrainSpec(
    name="tiny",
    model_cls=TinyTransformer,
    flavors={"debugmodel": TinyArgs()},
    tp_plan_fn=tiny_tp_plan,
    selective_ac_save_ops=("aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default"),
    flops_per_token_fn=matmul_flops_per_token,
)

register_train_spec(TINY_SPEC)  # registering the same object again is a no-op
