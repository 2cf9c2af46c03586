"""Config numbers must be values torch can really use: finite, and inside float32/int64.

``lr = inf`` or ``max_norm = nan`` would train (or save) garbage without any
error, so every float in every section, plugin sections included, must be
finite. Python floats are float64 and Python ints unbounded, but torch keeps
optimizer settings and scalars in float32 and seeds and counters in int64:
``lr = 1e39`` is finite in Python and overflows inside Adam's first step (a
traceback from a fused kernel), ``eps = 1e-50`` becomes 0 in float32 and turns the
first update into NaN, and ``seed = 10**20`` overflows ``torch.manual_seed``. So a
float must lie within float32's normal range (or be 0) and an int within int64.
Checked on the merged raw layers, before any model validates them, so the message
names the key whatever section it belongs to, and again on the validated values
(a TOML string such as ``"1e39"`` only becomes a float there).

A literal below even float64's range (``lr = 1e-400``) is 0.0 once parsed, a value the
check must accept; the TOML readers therefore parse floats with :func:`parse_toml_float`,
which keeps such a literal as an :class:`UnderflowedFloat` (0.0, remembering its text)
that the check refuses.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32; below it precision is lost, then 0
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_NONZERO_DIGITS = frozenset("123456789")


class UnderflowedFloat(float):
    """0.0 read from a literal with a non-zero digit (``1e-400``): too small even for float64. Its repr is
    the literal, so the message shows what the user wrote."""

    literal: str

    def __new__(cls, literal: str) -> UnderflowedFloat:
        value = super().__new__(cls, 0.0)
        value.literal = literal
        return value

    def __repr__(self) -> str:
        return self.literal


def parse_toml_float(text: str) -> float:
    """``tomllib``'s ``parse_float``: the float of ``text``, or an :class:`UnderflowedFloat` where a
    non-zero literal parsed to 0.0."""
    value = float(text)
    mantissa = text.lower().partition("e")[0]
    if value == 0.0 and not _NONZERO_DIGITS.isdisjoint(mantissa):
        return UnderflowedFloat(text)
    return value


def refuse_nonfinite(layer: dict[str, Any]) -> None:
    """Raise ConfigError naming the first key whose value (or an element of it) torch cannot represent."""
    for key, value in _numbers(layer, prefix=""):
        problem = _problem(value)
        if problem:
            raise ConfigError(f"{key} = {value!r}: {problem}")


def _problem(value: float | int) -> str:
    if isinstance(value, UnderflowedFloat):
        return (f"too small for any float (it reads as 0, not as the value written); torch computes with "
                f"float32, whose smallest normal value is {FLOAT32_TINY:.4g}. Set a larger value, or 0.")
    if isinstance(value, float):
        if not math.isfinite(value):
            return ("config values must be finite numbers (NaN and infinity are refused, they would train or "
                    "save non-finite weights without an error). Set a finite value.")
        if abs(value) > FLOAT32_MAX:
            return (f"too large for float32, the precision torch computes with (at most {FLOAT32_MAX:.4g} in "
                    f"magnitude); it would overflow to infinity in the first step. Set a smaller value.")
        if value != 0 and abs(value) < FLOAT32_TINY:
            return (f"too small for float32, the precision torch computes with (a non-zero value must be at "
                    f"least {FLOAT32_TINY:.4g} in magnitude); it would become 0 there. Set a larger value, or 0.")
        return ""
    if not INT64_MIN <= value <= INT64_MAX:
        return (f"does not fit in a 64-bit integer ({INT64_MIN} to {INT64_MAX}), which torch stores it in. "
                f"Set a smaller value.")
    return ""


def _numbers(value: object, *, prefix: str) -> list[tuple[str, float | int]]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (float, int)):
        return [(prefix, value)]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _numbers(v, prefix=f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, (list, tuple)):
        return [item for i, v in enumerate(value) for item in _numbers(v, prefix=f"{prefix}[{i}]")]
    return []
