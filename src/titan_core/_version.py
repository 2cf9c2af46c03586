"""Versions of the distribution and of the plugin contract."""

__version__ = "0.1.0"

# major.minor of the TrainSpec / ModelConverter contract. A plugin states the
# version it was written for; the core refuses a different major.
PLUGIN_API_VERSION = "1.0"
