"""A plugin function whose module is imported on its first call.

A spec's parallelism functions live in modules that import DTensor, which costs seconds;
``titan-train --list`` and ``--help`` import every spec and must stay about as cheap as
``import torch``. ``deferred`` stands in for such a function until it is called.
A leaf: imports nothing of titan_core.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def deferred(module: str, name: str) -> Callable[..., Any]:
    """A function that imports ``module`` when first called and passes every argument to its ``name``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    call.__doc__ = f"See {module}.{name} (imported on first call)."
    return call
