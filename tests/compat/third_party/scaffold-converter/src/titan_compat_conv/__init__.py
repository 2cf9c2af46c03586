"""titan-compat-conv: a titan-core converter plugin (entry point ``compat_conv``)."""

from .config import CompatConvConfig
from .converter import CompatConvConverter, CompatConvLinear

__all__ = ["CompatConvConverter", "CompatConvConfig", "CompatConvLinear"]
