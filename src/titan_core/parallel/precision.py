"""Which dtype the forward and backward compute in, and the autocast context for it."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def resolve_compute_dtype(setting: str, device: torch.device) -> torch.dtype:
    """``training.dtype`` as a torch dtype. ``auto`` is bfloat16 on CUDA and float32 elsewhere,
    because CPUs without AVX-512 BF16 / AMX run bfloat16 matmuls several times slower than fp32."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype: torch.dtype = getattr(torch, setting)  # "float32" / "bfloat16", checked by the config's Literal
    return dtype


def autocast_for(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision: parameters and optimizer state stay float32, matmuls run in ``dtype``."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
