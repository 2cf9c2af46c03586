"""titan-llama: the Llama 3 / 3.1 TrainSpec plugin for titan-core (entry point ``llama3``)."""

from titan_core import PLUGIN_API_VERSION

__all__ = ["PLUGIN_API_VERSION"]
