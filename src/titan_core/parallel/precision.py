"""Which dtype the forward and backward compute in (``resolve_compute_dtype``, with the run's other dtypes
in ``plugin/resolved.py``, what plugins receive), and the autocast context for it."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..plugin.resolved import resolve_compute_dtype

__all__ = ["autocast_for", "resolve_compute_dtype"]


def autocast_for(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision: parameters and optimizer state stay float32, matmuls run in ``dtype``."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
