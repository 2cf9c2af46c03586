"""Int8FakeQuantLinear: a Linear whose forward sees int-grid weights, with a straight-through backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fake_quantize(weight: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Quantize-dequantize with one symmetric absmax scale per output row.

    ``scale = max|w_row| / (2**(bits-1) - 1)``; ``q = clamp(round(w / scale), -qmax, qmax)``;
    returns ``q * scale``. ``round`` is torch's (half to even). An all-zero row
    keeps a tiny scale so it stays zero instead of becoming NaN.
    """
    qmax = 2 ** (bits - 1) - 1
    scale = (weight.abs().amax(dim=1, keepdim=True) / qmax).clamp(min=torch.finfo(weight.dtype).tiny)
    return torch.clamp(torch.round(weight / scale), -qmax, qmax) * scale


class _StraightThrough(torch.autograd.Function):
    """Forward: fake_quantize. Backward: identity (rounding has zero gradient almost everywhere)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, bits: int) -> torch.Tensor:
        return fake_quantize(weight, bits)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class Int8FakeQuantLinear(nn.Linear):
    """``y = x @ fake_quantize(W).T + b``; the parameters stay full precision for the optimizer."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, bits: int = 8,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.bits = bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, _StraightThrough.apply(self.weight, self.bits), self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int) -> Int8FakeQuantLinear:
        """A replacement that shares ``linear``'s parameters (works on the meta device)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, bits=bits)
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}"
