"""CompatConvConverter: rewrites the selected nn.Linear modules into CompatConvLinear (on the meta device).

Replace ``CompatConvLinear.forward`` with your technique. The layer stays an ``nn.Linear``
subclass with the same parameters, so parameter names, FSDP2 sharding, torch's
tensor-parallel styles and checkpoints work unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core import ModelConverter, select_linears

from .config import CompatConvConfig


def round_mantissa(w: torch.Tensor, bits: int) -> torch.Tensor:
    """``w`` rounded to ``bits`` mantissa bits, with a straight-through gradient."""
    mantissa, exponent = torch.frexp(w)
    scale = float(2 ** (bits + 1))
    rounded = torch.ldexp(torch.round(mantissa * scale) / scale, exponent)
    return w + (rounded - w).detach()


class CompatConvLinear(nn.Linear):
    """An nn.Linear whose forward uses its weight rounded to ``mantissa_bits`` bits."""

    mantissa_bits: int = 7

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, round_mantissa(self.weight, self.mantissa_bits), self.bias)


class CompatConvConverter(ModelConverter[CompatConvConfig]):  # the type argument is the config: self.config is a CompatConvConfig
    plugin_api_version = "1.0"  # the titan-core plugin API this converter was written for
    prototype = False  # True: `titan-train --list` tags it [prototype] (an experiment, not for production runs)

    def selection_keys(self) -> list[str]:
        return ["fqns", "filter_fqns"]

    def select(self, model: nn.Module) -> list[str]:
        config = self.config  # validated by the base class
        return select_linears(model, section="compat_conv", fqns=config.fqns, filter_fqns=config.filter_fqns,
                              eligible=lambda fqn, module: not isinstance(module, CompatConvLinear))

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            module = model.get_submodule(fqn)
            # Swapping the class keeps the module object, its (meta) parameters and their names.
            module.__class__ = CompatConvLinear
            assert isinstance(module, CompatConvLinear)  # it is now; this also tells a type checker
            module.mantissa_bits = self.config.mantissa_bits
