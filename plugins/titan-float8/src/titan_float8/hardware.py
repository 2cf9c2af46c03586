"""The one hardware fact float8 needs; a function so tests can pretend to have another GPU."""

from __future__ import annotations

import torch


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    return torch.cuda.get_device_capability(device)


#: float8 matmul kernels (torch._scaled_mm) exist from Ada / Hopper on.
MIN_FLOAT8_CAPABILITY = (8, 9)
