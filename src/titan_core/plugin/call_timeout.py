"""model.plugin_timeout_s, the bound on one call into a plugin, held for the process.

A leaf: discovery (which bounds a plugin's import) and guard (which bounds every later call) both
read it, and guard imports discovery.
"""

from __future__ import annotations

__all__ = ["DEFAULT_PLUGIN_TIMEOUT_S", "plugin_timeout", "set_plugin_timeout"]

# model.plugin_timeout_s: how long one call into a plugin may take (a whole set-up step such as
# convert() or parallelize_fn, or one forward). Set from the run's config by the Trainer.
DEFAULT_PLUGIN_TIMEOUT_S = 1800.0
_timeout_s: list[float] = [DEFAULT_PLUGIN_TIMEOUT_S]


def set_plugin_timeout(seconds: float) -> None:
    _timeout_s[0] = seconds


def plugin_timeout() -> float:
    return _timeout_s[0]
