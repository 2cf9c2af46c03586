"""titan-mx-prototype: torchao's MXFP8 training prototype as a titan-core model converter (``[mx]``)."""

from __future__ import annotations

from .config import MXConfig
from .converter import MXConverter

__all__ = ["MXConfig", "MXConverter"]
