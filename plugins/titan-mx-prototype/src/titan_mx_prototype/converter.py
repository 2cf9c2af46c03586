"""MXConverter: MXFP8 training of selected linears with torchao's prototype (``[mx]``).

torchao 0.18 applies MX training by swapping each selected linear's weight for
an ``MXFP8TrainingWeightWrapperTensor`` (``quantize_`` with an
``MXFP8TrainingOpConfig``); the module stays an ``nn.Linear``, and its matmuls
quantize activations, weights and gradients to MXFP8 on the fly. It is a
prototype: APIs and numerics may change between torchao releases.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from titan_core import (
    ConfigError,
    GroupedExperts,
    ModelConverter,
    TitanError,
    select_linears,
    select_modules,
)
from titan_core.runtime.torch_compat import dtensor_has_single_dim_scaled_mm

from .config import MXConfig
from .hardware import resolve_emulate

logger = logging.getLogger(__name__)

#: torchao's MXFP8 training path fixes 32 elements per shared scale.
BLOCK_SIZE = 32


class TorchAOMX:
    """The few torchao names this converter uses, imported on demand (a TitanError saying how to install it)."""

    def __init__(self) -> None:
        try:
            from torchao import quantize_
            from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
            from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor
            from torchao.quantization.quantize_.common import KernelPreference
        except ImportError as exc:
            raise TitanError(
                f"the mx converter needs torchao's MX training prototype: pip install 'torchao>=0.18' "
                f"(import failed: {exc})"
            ) from exc
        self.quantize_: Any = quantize_
        self.MXFP8TrainingOpConfig: Any = MXFP8TrainingOpConfig
        self.MXFP8TrainingRecipe: Any = MXFP8TrainingRecipe
        self.KernelPreference: Any = KernelPreference
        self.MXFP8TrainingWeightWrapperTensor: Any = MXFP8TrainingWeightWrapperTensor


class MXConverter(ModelConverter[MXConfig]):
    """MXFP8 training (torchao prototype) for the selected bias-free linear layers; see ``MXConfig``."""

    prototype = True
    plugin_api_version = "1.0"  # the titan-core plugin API this converter was written for

    def setup(self) -> None:
        self._ao = TorchAOMX()
        self.emulate, self.emulate_reason = resolve_emulate(self.config.emulate, self.job.device)
        logger.info("mx (prototype): recipe %s, %s", self.config.recipe, self.emulate_reason)

    def selection_keys(self) -> list[str]:
        return ["fqns", "filter_fqns", "moe_fqns"]

    def select(self, model: nn.Module) -> list[str]:
        def eligible(fqn: str, module: nn.Linear) -> bool:
            out_dim, in_dim = module.weight.shape
            bias: torch.Tensor | None = module.bias  # torch types it as always present; it may be None
            if bias is not None:
                # torchao 0.18's MX linear override computes x @ w.T and drops the bias.
                logger.info("mx: skipping %s (has a bias; MX training supports bias-free linears only)", fqn)
                return False
            if out_dim % BLOCK_SIZE or in_dim % BLOCK_SIZE:
                logger.info("mx: skipping %s (weight %dx%d not divisible by %d)", fqn, out_dim, in_dim, BLOCK_SIZE)
                return False
            return not self.is_mx_weight(module)

        linears = select_linears(
            model, section="mx", fqns=self.config.fqns, filter_fqns=self.config.filter_fqns, eligible=eligible
        )
        return linears + self.select_experts(model)

    def select_experts(self, model: nn.Module) -> list[str]:
        """The MoE experts ``moe_fqns`` opts in: their grouped GEMMs go through torchao's MXFP8 path."""
        if not self.config.moe_fqns:
            return []

        def eligible(fqn: str, experts: GroupedExperts) -> bool:
            _, hidden, dim = experts.w1.shape  # both contraction dims (dim for w1/w3, hidden for w2)
            if hidden % BLOCK_SIZE or dim % BLOCK_SIZE:
                logger.info("mx: skipping experts %s (dim %d, hidden %d not divisible by %d)", fqn, dim, hidden,
                            BLOCK_SIZE)
                return False
            return not self.is_mx_weight(experts)

        return select_modules(model, GroupedExperts, key="mx.moe_fqns", fqns=self.config.moe_fqns,
                              filter_fqns=self.config.filter_fqns, eligible=eligible)

    def torchao_config(self) -> Any:
        """The ``MXFP8TrainingOpConfig`` this converter applies."""
        recipe = self._ao.MXFP8TrainingRecipe(self.config.recipe)
        kernels = self._ao.KernelPreference
        kernel = kernels.EMULATED if self.emulate else kernels.AUTO
        return dataclasses.replace(self._ao.MXFP8TrainingOpConfig.from_recipe(recipe), kernel_preference=kernel)

    def is_mx_weight(self, module: nn.Module) -> bool:
        """Whether ``module``'s weight (an expert block's ``w1``) is an MX training wrapper (converted)."""
        weight = getattr(module, "w1" if isinstance(module, GroupedExperts) else "weight", None)
        return weight is not None and isinstance(weight.data, self._ao.MXFP8TrainingWeightWrapperTensor)

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        wanted = set(fqns)
        if not dtensor_has_single_dim_scaled_mm():
            raise TitanError(
                f"the mx converter needs torch >= 2.13, this is torch {torch.__version__}: torchao's MXFP8 training "
                f"asserts DTensor's single-dim _scaled_mm strategy, which torch 2.11 lacks. Install torch 2.13 "
                f"(pip install 'torch>=2.13') or leave [mx] out of model.converters")
        try:
            self._ao.quantize_(model, self.torchao_config(), filter_fn=lambda module, fqn: fqn in wanted)
        except AssertionError as exc:  # torchao states its requirements as asserts
            raise TitanError(f"torchao could not apply MX training: {exc}") from exc
        missed = [fqn for fqn in fqns if not self.is_mx_weight(model.get_submodule(fqn))]
        if missed:
            raise ConfigError(f"mx could not convert {missed}: only bias-free nn.Linear modules and MoE experts "
                              f"(GroupedExperts) can use MX training")
