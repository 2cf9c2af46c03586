"""titan-compat-spec: a titan-core model plugin (entry point ``compat_spec``)."""

from .model import CompatSpecArgs, CompatSpecModel, flops_per_token
from .spec import CompatSpecSection, flavors, compat_spec_spec

__all__ = ["CompatSpecArgs", "CompatSpecModel", "CompatSpecSection", "flavors", "flops_per_token", "compat_spec_spec"]
