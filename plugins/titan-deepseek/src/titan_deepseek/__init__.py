"""titan-deepseek: the DeepSeek-V3 TrainSpec plugin for titan-core (entry point ``deepseek_v3``)."""

from titan_core import PLUGIN_API_VERSION

__all__ = ["PLUGIN_API_VERSION"]
