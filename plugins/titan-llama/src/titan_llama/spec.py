"""The llama3 TrainSpec: what the titan.train_specs entry point ``llama3`` names."""

from __future__ import annotations

from titan_core import TrainSpec

from .config import LlamaSection
from .flavors import llama3_flavors
from .model import Transformer, flops_per_token
from .parallelize import parallelize_llama, validate_llama_layout
from .pipeline import pipeline_llama

llama3_spec = TrainSpec(
    name="llama3",
    model_cls=Transformer,
    flavors=llama3_flavors,
    parallelize_fn=parallelize_llama,
    pipelining_fn=pipeline_llama,
    config_model=LlamaSection,
    validate_fn=validate_llama_layout,
    flops_per_token_fn=flops_per_token,
    plugin_api_version="1.0",  # the titan-core plugin API this spec was written for
)
