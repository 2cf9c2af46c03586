"""titan-qwen3: the Qwen3 / Qwen3-MoE TrainSpec plugin for titan-core (entry point ``qwen3``)."""

from titan_core import PLUGIN_API_VERSION

__all__ = ["PLUGIN_API_VERSION"]
