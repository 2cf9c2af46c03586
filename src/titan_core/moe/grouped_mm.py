"""Experts' matmuls over tokens sorted by expert: one grouped GEMM where the device has it.

``x`` holds the tokens of expert 0, then those of expert 1, ... (``counts[e]`` rows each);
``weight[e]`` is expert e's matrix in ``nn.Linear`` layout ([out, in]). ``torch._grouped_mm``
does every expert in one call: on CUDA devices of compute capability 9.0+ in bfloat16, and
on CPU in float32, where torch 2.13 computes each group with the same matmul a per-expert
loop would use (bit-identical results, forward and backward; tests/qwen3 checks it). It
wants 16-byte aligned rows, so a width that is not a multiple of 4 floats, like any other
case (older GPUs, other dtypes), takes the fallback: one dense matmul per *expert* (never a
loop over tokens) on its contiguous block.

A weight of a tensor subclass (a converter's, e.g. torchao's MXFP8 training wrapper) always
goes through ``torch._grouped_mm``, which the subclass intercepts to run its own low-precision
grouped GEMM (emulated on CPU); its output comes back in ``x``'s dtype.
"""

from __future__ import annotations

import torch

from ..runtime.torch_compat import grouped_mm, has_grouped_mm

_ALIGNMENT_BYTES = 16  # torch._grouped_mm's stride requirement


def grouped_mm_available(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
    """Whether ``torch._grouped_mm`` serves this input (and ``weight``, when given)."""
    if not has_grouped_mm():
        return False
    if x.device.type == "meta":  # shapes only (the memory plan's probe): the grouped GEMM's meta kernel
        return True
    if x.is_cuda:
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return False
    widths = [x.shape[-1]] if weight is None else [x.shape[-1], weight.shape[-2]]
    return all(width * x.element_size() % _ALIGNMENT_BYTES == 0 for width in widths)


def takes_grouped_mm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`grouped_linear` runs ``torch._grouped_mm`` for these operands (else the per-expert loop)."""
    converted = type(weight) not in (torch.Tensor, torch.nn.Parameter)
    return converted or (grouped_mm_available(x, weight) and weight.dtype == x.dtype)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``x[rows of e] @ weight[e].T`` for every expert e, stacked in ``x``'s order: [tokens, out]."""
    if takes_grouped_mm(x, weight):
        # Offsets are the cumulative row counts (int32): where each expert's block ends.
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        return grouped_mm(x, weight.transpose(-2, -1), offs=offsets).to(x.dtype)
    sizes = [int(n) for n in counts.tolist()]
    # Experts without rows still multiply (an empty block): the output then always depends on
    # every weight, so backward takes the same path on every rank. Under expert parallelism a
    # rank whose experts got no tokens would otherwise skip its all-to-all in backward and
    # leave its peers waiting.
    return torch.cat([block @ weight[e].T for e, block in enumerate(torch.split(x, sizes))])
