"""The qwen3 TrainSpec: what the titan.train_specs entry point ``qwen3`` names.

Parallelism is titan-core's default (activation checkpointing -> compile -> FSDP2 over
the blocks); the spec has no tensor-parallel plan and no pipeline function yet, so
``tp > 1`` and ``pp > 1`` are refused with a message.
"""

from __future__ import annotations

from titan_core import TrainSpec

from .config import Qwen3Section
from .flavors import qwen3_flavors
from .hf_adapter import Qwen3StateDictAdapter
from .model import Transformer, flops_per_token

qwen3_spec = TrainSpec(
    name="qwen3",
    model_cls=Transformer,
    flavors=qwen3_flavors,
    config_model=Qwen3Section,
    flops_per_token_fn=flops_per_token,
    state_dict_adapter=Qwen3StateDictAdapter(),
    plugin_api_version="1.0",  # the titan-core plugin API this spec was written for
)
