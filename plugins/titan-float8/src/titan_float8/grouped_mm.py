"""Float8 rowwise grouped GEMM for MoE experts, emulated in float32 (CPU, or GPUs without the kernels).

The recipe is torchao 0.18's ``fp8_rowwise`` for grouped GEMMs
(``torchao.prototype.moe_training.fp8_grouped_mm``), whose kernels are Triton and
``torch._scaled_grouped_mm`` only (CUDA SM90+; torchao has no emulated variant of it, unlike
its MXFP8 recipe). Every operand is cast to float8 e4m3 with one scale per row or column,
``scale = 448 / amax`` rounded down to a power of two, values clamped to +-448:

============  ==========================================  =====================================
GEMM          left operand scaled per                     right operand scaled per
============  ==========================================  =====================================
output        token row of x (over K)                     expert, output column (over K)
grad_input    token row of grad_output (over N)           expert, input column of w (over N)
grad_weight   expert group, column of grad_output (over   expert group, column of x (over the
              the group's tokens)                         group's tokens)
============  ==========================================  =====================================

The emulation quantizes for real (a cast to ``torch.float8_e4m3fn`` and back) and then runs
``torch._grouped_mm`` in float32 (on CPU; one matmul per expert on other devices). Scales are
powers of two, so dividing the float8 values by them is exact and the float32 product equals
the scaled float8 GEMM up to the accumulation order of the kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from titan_core.runtime.torch_compat import grouped_mm

FLOAT8 = torch.float8_e4m3fn
FLOAT8_MAX = torch.finfo(FLOAT8).max
#: an all-zero row or column gets this amax (torchao's guard), so its scale stays finite
AMAX_FLOOR = 1e-12


def scales_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """float32 scales ``448 / amax``, rounded down to a power of two (the division in float64, as torchao)."""
    scale = (FLOAT8_MAX / torch.clamp(amax.to(torch.float64), min=AMAX_FLOOR)).to(torch.float32)
    return torch.exp2(torch.floor(torch.log2(scale)))


def fake_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` through float8 e4m3 with ``scale`` (broadcast) and back, in float32."""
    scaled = (x.to(torch.float32) * scale).clamp(-FLOAT8_MAX, FLOAT8_MAX)
    return scaled.to(FLOAT8).to(torch.float32) / scale


def quantize_along(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Fake-quantize with one scale per slice along ``dim`` (the amax is taken over ``dim``)."""
    return fake_quantize(x, scales_from_amax(x.abs().amax(dim=dim, keepdim=True)))


def quantize_columns_per_group(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Fake-quantize a [tokens, width] tensor with one scale per (expert group, column).

    Group g holds rows ``offs[g-1]:offs[g]``; rows after the last offset belong to no
    expert (``torch._grouped_mm`` ignores them) and get a group of their own.
    """
    rows = x.shape[0]
    ends = offs.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    counts = torch.cat([counts, (rows - ends[-1:]).clamp(min=0)])
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=x.device), counts)
    amax = x.new_zeros(counts.numel(), x.shape[1], dtype=torch.float32)
    amax = amax.scatter_reduce(0, group[:, None].expand(-1, x.shape[1]), x.abs().to(torch.float32), "amax")
    return fake_quantize(x, scales_from_amax(amax)[group])


def grouped_mm_float32(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                       per_expert: bool | None = None) -> torch.Tensor:
    """``torch._grouped_mm(a, b, offs=offs)`` for float32 operands on any device.

    torch runs float32 grouped GEMMs on CPU only (CUDA's want bfloat16 on SM90+), so other
    devices take one matmul per expert block: [tokens, K] x [E, K, N] -> [tokens, N], or
    [N, tokens] x [tokens, K] -> [E, N, K] (the weight gradient). ``per_expert`` forces either
    way (default: by device).
    """
    if not (a.device.type != "cpu" if per_expert is None else per_expert):
        return grouped_mm(a, b, offs=offs)
    ends = [0, *(int(end) for end in offs.tolist())]
    blocks = list(zip(ends[:-1], ends[1:]))
    if b.ndim == 3:
        out = a.new_zeros(a.shape[0], b.shape[-1])  # rows after the last offset belong to no expert
        for e, (start, end) in enumerate(blocks):
            out[start:end] = a[start:end] @ b[e]
        return out
    return torch.stack([a[:, start:end] @ b[start:end] for start, end in blocks])


class EmulatedFloat8GroupedMM(torch.autograd.Function):
    """``torch._grouped_mm(x, w_t, offs=offs)`` with x [tokens, K] and w_t [experts, K, N], in float8 rowwise."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w_t, offs)
        out = grouped_mm_float32(quantize_along(x, -1), quantize_along(w_t, 1), offs)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w_t, offs = ctx.saved_tensors
        # grad_x = grad_out @ w: grad_out per token row, w [E, N, K] per input column k (amax over N).
        w = w_t.transpose(-2, -1)
        grad_x = grouped_mm_float32(quantize_along(grad_out, -1), quantize_along(w, 1), offs)
        # grad_w_t[e] = x_e^T @ grad_out_e: both scaled per column within each expert's tokens.
        grad_w = grouped_mm_float32(
            quantize_columns_per_group(grad_out, offs).t(), quantize_columns_per_group(x, offs), offs
        )  # [E, N, K]
        return grad_x.to(x.dtype), grad_w.transpose(-2, -1).to(w_t.dtype), None


def emulated_float8_grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Float8 rowwise grouped GEMM, emulated (see the module docstring); differentiable in x and w_t."""
    out: torch.Tensor = EmulatedFloat8GroupedMM.apply(x, w_t, offs)
    return out
