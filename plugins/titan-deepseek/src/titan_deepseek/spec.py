"""The deepseek_v3 TrainSpec: what the titan.train_specs entry point ``deepseek_v3`` names.

Parallelism is titan-core's default (TP -> activation checkpointing -> compile -> FSDP2 over the
blocks; expert parallelism from ``titan_core.moe``'s blocks) with this model's TP plan
(``tp_plan.py``: latent attention split by heads, dense MLPs sharded, MoE blocks replicated) and
titan-core's pipeline splitter over ``layers``. The plan and the layout check are reached through
``titan_core.plugin.deferred`` stand-ins, so ``titan-train --list`` stays cheap.
"""

from __future__ import annotations

from titan_core import TrainSpec
from titan_core.plugin.deferred import deferred

from .config import DeepSeekV3Section
from .flavors import deepseek_v3_flavors
from .hf_adapter import DeepSeekV3StateDictAdapter
from .model import Transformer, flops_per_token

deepseek_v3_tp_plan = deferred("titan_deepseek.tp_plan", "deepseek_v3_tp_plan")
validate_deepseek_v3_layout = deferred("titan_deepseek.parallelize", "validate_deepseek_v3_layout")

# titan-core's pipeline with its defaults: blocks ``layers``, the first stage keeps ``tok_embeddings``, the last
# ``norm`` and ``output``.
pipeline_deepseek_v3 = deferred("titan_core.parallel.pipeline", "pipeline_model")


deepseek_v3_spec = TrainSpec(
    name="deepseek_v3",
    model_cls=Transformer,
    flavors=deepseek_v3_flavors,
    tp_plan_fn=deepseek_v3_tp_plan,
    pipelining_fn=pipeline_deepseek_v3,
    validate_fn=validate_deepseek_v3_layout,
    config_model=DeepSeekV3Section,
    flops_per_token_fn=flops_per_token,
    state_dict_adapter=DeepSeekV3StateDictAdapter(),
    plugin_api_version="1.2",  # the titan-core plugin API this spec was written for (LossTerm, new in 1.2)
)
