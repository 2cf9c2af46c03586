"""The deepseek_v3 TrainSpec: what the titan.train_specs entry point ``deepseek_v3`` names.

Parallelism is titan-core's default (activation checkpointing -> compile -> FSDP2 over the
blocks; expert parallelism from ``titan_core.moe``'s blocks) and titan-core's pipeline splitter
over ``layers``. No TP plan yet: ``parallelism.tp > 1`` is refused by the core. The layout check
is reached through a ``titan_core.plugin.deferred`` stand-in, so ``titan-train --list`` stays cheap.
"""

from __future__ import annotations

from titan_core import TrainSpec
from titan_core.plugin.deferred import deferred

from .config import DeepSeekV3Section
from .flavors import deepseek_v3_flavors
from .hf_adapter import DeepSeekV3StateDictAdapter
from .model import Transformer, flops_per_token

validate_deepseek_v3_layout = deferred("titan_deepseek.parallelize", "validate_deepseek_v3_layout")

# titan-core's pipeline with its defaults: blocks ``layers``, the first stage keeps ``tok_embeddings``, the last
# ``norm`` and ``output``.
pipeline_deepseek_v3 = deferred("titan_core.parallel.pipeline", "pipeline_model")


deepseek_v3_spec = TrainSpec(
    name="deepseek_v3",
    model_cls=Transformer,
    flavors=deepseek_v3_flavors,
    pipelining_fn=pipeline_deepseek_v3,
    validate_fn=validate_deepseek_v3_layout,
    config_model=DeepSeekV3Section,
    flops_per_token_fn=flops_per_token,
    state_dict_adapter=DeepSeekV3StateDictAdapter(),
    plugin_api_version="1.1",  # the titan-core plugin API this spec was written for (it uses models.decoder, new in 1.1)
)
