"""titan-float8: torchao float8 training as a titan-core model converter (``[float8]``)."""

from __future__ import annotations

from titan_core import fqn_matches

from .config import Float8Config
from .converter import Float8Converter
from .settings import Float8Settings

__all__ = ["Float8Config", "Float8Converter", "Float8Settings", "fqn_matches"]
