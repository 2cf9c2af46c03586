"""Experts' matmuls over tokens sorted by expert: one grouped GEMM where the device has it.

``x`` holds the tokens of expert 0, then those of expert 1, ... (``counts[e]`` rows each);
``weight[e]`` is expert e's matrix in ``nn.Linear`` layout ([out, in]). On CUDA devices of
compute capability 9.0+ with bfloat16, ``torch._grouped_mm`` does every expert in one
kernel. Elsewhere (CPU, older GPUs, float32) the fallback loops over the *experts*, not
the tokens: one dense matmul per expert on its contiguous block, which gives the same
numbers as computing each expert on its own (exactly what a per-expert reference does).
"""

from __future__ import annotations

import torch


def grouped_mm_available(x: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` serves this input (a Hopper-class GPU, bfloat16)."""
    if not (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")):
        return False
    return torch.cuda.get_device_capability(x.device) >= (9, 0)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``x[rows of e] @ weight[e].T`` for every expert e, stacked in ``x``'s order: [tokens, out]."""
    if grouped_mm_available(x):
        # The kernel wants 16-byte aligned group ends; offsets are cumulative int32 row counts.
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        return torch._grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
    sizes = [int(n) for n in counts.tolist()]
    # Experts without rows still multiply (an empty block): the output then always depends on
    # every weight, so backward takes the same path on every rank. Under expert parallelism a
    # rank whose experts got no tokens would otherwise skip its all-to-all in backward and
    # leave its peers waiting.
    return torch.cat([block @ weight[e].T for e, block in enumerate(torch.split(x, sizes))])
