"""Non-finite numbers are never valid config values.

``lr = inf`` or ``max_norm = nan`` would train (or save) garbage without any
error, so every float in every section, plugin sections included, must be
finite. Checked on the merged raw layers, before any model validates them, so
the message names the key whatever section it belongs to.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError


def refuse_nonfinite(layer: dict[str, Any]) -> None:
    """Raise ConfigError naming the first key whose value (or an element of it) is NaN or infinite."""
    for key, value in _floats(layer, prefix=""):
        if not math.isfinite(value):
            raise ConfigError(
                f"{key} = {value}: config values must be finite numbers (NaN and infinity are refused, "
                f"they would train or save non-finite weights without an error). Set a finite value."
            )


def _floats(value: Any, *, prefix: str) -> list[tuple[str, float]]:
    if isinstance(value, float):
        return [(prefix, value)]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _floats(v, prefix=f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, (list, tuple)):
        return [item for i, v in enumerate(value) for item in _floats(v, prefix=f"{prefix}[{i}]")]
    return []
