"""The hardware facts MX training needs; functions so tests can pretend to have another GPU."""

from __future__ import annotations

import torch


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    return torch.cuda.get_device_capability(device)


#: MXFP8 matmuls (torch._scaled_mm with e8m0 block scales, cuBLAS / CUTLASS) need Blackwell.
MIN_MX_CAPABILITY = (10, 0)


def resolve_emulate(emulate: bool | str, device: torch.device) -> tuple[bool, str]:
    """(emulate?, why). Raises TitanError when real kernels are asked for but cannot run."""
    from titan_core import TitanError

    if emulate is True:
        return True, "mx.emulate=true"
    if device.type != "cuda":
        if emulate is False:
            raise TitanError(
                f"mx.emulate=false asks for real MXFP8 kernels, which need an NVIDIA Blackwell GPU (compute "
                f"capability 10.0+, SM100: B200 / GB200) with CUDA 12.8+, but this run uses device {device.type}. "
                f"Set --mx.emulate=auto (or true) to emulate MXFP8 matmuls in high precision (slow; for testing)."
            )
        return True, f"emulated: no MXFP8 kernels on {device.type}"
    major, minor = cuda_capability(device)
    if (major, minor) >= MIN_MX_CAPABILITY:
        return False, f"real MXFP8 kernels on sm_{major}{minor}"
    raise TitanError(
        f"MX (MXFP8) training needs an NVIDIA Blackwell GPU (compute capability 10.0 or newer, SM100: B200 / "
        f"GB200) with CUDA 12.8+ for its block-scaled float8 matmul kernels; this GPU has compute capability "
        f"{major}.{minor} (sm_{major}{minor}). Set --mx.emulate=true to emulate MXFP8 matmuls in high precision "
        f"(slow; for testing only), or use the float8 converter, which runs on SM89+."
    )
