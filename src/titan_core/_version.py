"""Versions of the distribution and of the plugin contract."""

__version__ = "0.1.0"

# major.minor of the TrainSpec / ModelConverter contract (docs/plugins.md, "Versions"). A plugin states the
# version it was written for; the core serves its major at any minor up to this one.
PLUGIN_API_VERSION = "1.3"
