"""The hardware facts MX training needs; functions so tests can pretend to have another GPU."""

from __future__ import annotations

import torch

from titan_core.plugin.emulation import KernelNeeds, resolve_emulation


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    return torch.cuda.get_device_capability(device)


#: MXFP8 matmuls (torch._scaled_mm with e8m0 block scales, cuBLAS / CUTLASS) need Blackwell.
MIN_MX_CAPABILITY = (10, 0)


_NEEDS = KernelNeeds(
    section="mx", kernels="MXFP8", emulated_in="high precision", min_capability=MIN_MX_CAPABILITY,
    hardware="an NVIDIA Blackwell GPU (compute capability 10.0+, SM100: B200 / GB200) with CUDA 12.8+",
    too_old="MX (MXFP8) training needs an NVIDIA Blackwell GPU (compute capability 10.0 or newer, SM100: B200 / "
    "GB200) with CUDA 12.8+ for its block-scaled float8 matmul kernels; this GPU has compute capability "
    "{major}.{minor} (sm_{major}{minor}). Set --mx.emulate=true to emulate MXFP8 matmuls in high precision "
    "(slow; for testing only), or use the float8 converter, which runs on SM89+.",
)


def resolve_emulate(emulate: bool | str, device: torch.device) -> tuple[bool, str]:
    """(emulate?, why). Raises TitanError when real kernels are asked for but cannot run."""
    return resolve_emulation(emulate, device, _NEEDS, cuda_capability)
