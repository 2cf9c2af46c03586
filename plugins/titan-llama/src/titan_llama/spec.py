"""The llama3 TrainSpec: what the titan.train_specs entry point ``llama3`` names.

The parallelism functions are reached through ``titan_core.plugin.deferred`` stand-ins that import
their modules on first call: those modules import DTensor, which costs seconds, and
``titan-train --list`` / ``--help`` must stay about as cheap as ``import torch``.
"""

from __future__ import annotations

from titan_core import TrainSpec
from titan_core.plugin.deferred import deferred

from .ac_ops import LLAMA_SELECTIVE_SAVE_OPS
from .config import LlamaSection
from .flavors import llama3_flavors
from .hf_adapter import LlamaStateDictAdapter
from .model import Transformer, flops_per_token

parallelize_llama = deferred("titan_llama.parallelize", "parallelize_llama")
llama_tp_plan = deferred("titan_llama.tp_plan", "llama_tp_plan")
pipeline_llama = deferred("titan_llama.pipeline", "pipeline_llama")
validate_llama_layout = deferred("titan_llama.parallelize", "validate_llama_layout")


llama3_spec = TrainSpec(
    name="llama3",
    model_cls=Transformer,
    flavors=llama3_flavors,
    # titan-core's default TP -> AC -> compile -> FSDP2 with this TP plan, plus one Llama rule
    # (a user's op list naming an SDPA kernel also saves the fused CPU kernel).
    parallelize_fn=parallelize_llama,
    tp_plan_fn=llama_tp_plan,
    selective_ac_save_ops=LLAMA_SELECTIVE_SAVE_OPS,
    pipelining_fn=pipeline_llama,
    pipeline_takes_positions=True,  # every stage is a Transformer: forward(h, positions=...)
    config_model=LlamaSection,
    validate_fn=validate_llama_layout,
    flops_per_token_fn=flops_per_token,
    state_dict_adapter=LlamaStateDictAdapter(),
    plugin_api_version="1.1",  # the titan-core plugin API this spec was written for (it uses models.decoder, new in 1.1)
)
