"""The qwen3 TrainSpec: what the titan.train_specs entry point ``qwen3`` names.

Parallelism is titan-core's default (TP -> activation checkpointing -> compile -> FSDP2
over the blocks) with Qwen3's TP plan (``tp_plan.py``: the dense parts sharded, MoE blocks
replicated), and titan-core's pipeline splitter over ``layers``. The parallelism functions
are reached through ``titan_core.plugin.deferred`` stand-ins that import their modules on first call: those modules
import DTensor, which costs seconds, and ``titan-train --list`` must stay cheap.
"""

from __future__ import annotations

from titan_core import TrainSpec
from titan_core.plugin.deferred import deferred

from .config import Qwen3Section
from .flavors import qwen3_flavors
from .hf_adapter import Qwen3StateDictAdapter
from .model import Transformer, flops_per_token

qwen3_tp_plan = deferred("titan_qwen3.tp_plan", "qwen3_tp_plan")
validate_qwen3_layout = deferred("titan_qwen3.parallelize", "validate_qwen3_layout")

# titan-core's pipeline with its defaults: blocks ``layers``, the first stage keeps ``tok_embeddings``, the last
# ``norm`` and ``output``.
pipeline_qwen3 = deferred("titan_core.parallel.pipeline", "pipeline_model")


qwen3_spec = TrainSpec(
    name="qwen3",
    model_cls=Transformer,
    flavors=qwen3_flavors,
    tp_plan_fn=qwen3_tp_plan,
    pipelining_fn=pipeline_qwen3,
    pipeline_takes_positions=True,  # every stage is a Transformer: forward(h, positions=...)
    validate_fn=validate_qwen3_layout,
    config_model=Qwen3Section,
    flops_per_token_fn=flops_per_token,
    state_dict_adapter=Qwen3StateDictAdapter(),
    plugin_api_version="1.3",  # the titan-core plugin API this spec was written for (QK-clip through its QK-norms, new in 1.3)
)
