"""Float8Converter: swaps selected nn.Linear for torchao's Float8Linear (float8 training).

torchao is imported only when the converter is built, so listing plugins and
runs without float8 never import it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from types import ModuleType
from typing import Any

from torch import nn

from titan_core import (
    ConfigError,
    GroupedExperts,
    ModelConverter,
    TensorParallelStyles,
    TitanError,
    select_linears,
)

from .config import Float8Config
from .moe import convert_experts, select_experts
from .settings import Float8Settings, resolve_settings

logger = logging.getLogger(__name__)

#: float8 matmuls need both dims of the weight divisible by 16 (hardware tile size)
DIM_MULTIPLE = 16


def _is_rank0() -> bool:
    # torchrun's environment; converters are built after the process group, but the env is enough.
    return int(os.environ.get("RANK", "0")) == 0


def import_torchao_float8() -> ModuleType:
    """``torchao.float8``, or a TitanError saying how to install it."""
    try:
        import torchao.float8 as ao_float8
    except ImportError as exc:
        raise TitanError(
            f"the float8 converter needs torchao: pip install 'torchao>=0.18' (import failed: {exc})"
        ) from exc
    return ao_float8


class Float8Converter(ModelConverter[Float8Config]):
    """Float8 training (torchao) for the selected linear layers; see ``Float8Config``."""

    plugin_api_version = "1.0"  # the titan-core plugin API this converter was written for

    def setup(self) -> None:
        config, parallel_dims = self.config, self.parallel_dims
        self._ao = import_torchao_float8()
        if config.auto_filter_small_kn and config.recipe == "rowwise_with_gw_hp":
            raise ConfigError(
                "float8.auto_filter_small_kn is not available with float8.recipe=rowwise_with_gw_hp: torchao has "
                "no size heuristic for that recipe. Turn auto_filter_small_kn off and choose layers with "
                "float8.fqns / float8.filter_fqns, or use recipe tensorwise or rowwise."
            )
        self.settings: Float8Settings = resolve_settings(config, parallel_dims, self.job)
        logger.info(
            "float8: recipe %s, %s; fsdp float8 all-gather %s (%s)",
            self.settings.recipe, self.settings.emulate_reason,
            "on" if self.settings.enable_fsdp_float8_all_gather else "off", self.settings.reason,
        )
        if _is_rank0() and parallel_dims.fsdp_enabled and config.fsdp_float8_all_gather == "auto" \
                and not self.settings.enable_fsdp_float8_all_gather:
            # A warning, not info: nothing configures logging by default, and a user who asked
            # for FSDP should see why the weights travel in high precision (more bytes per all-gather).
            logger.warning(
                "float8: FSDP float8 all-gather is off: %s; FSDP all-gathers the weights in high "
                "precision and they are cast to float8 after the all-gather", self.settings.reason,
            )
        if self.settings.precompute_scale:
            # Only this setting needs a hook; set on the instance so the core
            # registers nothing when the all-gather is off.
            self.post_optimizer_hook = self._precompute_scales  # type: ignore[method-assign]

    def selection_keys(self) -> list[str]:
        return ["fqns", "filter_fqns", "auto_filter_small_kn", "moe_fqns"]

    def select(self, model: nn.Module) -> list[str]:
        size_filter = None
        if self.config.auto_filter_small_kn:
            # filter_fqns is applied by select_linears with our matching rule, so pass none here.
            size_filter = self._ao._auto_filter_for_recipe(self.config.recipe, filter_fqns=[])

        def eligible(fqn: str, module: nn.Linear) -> bool:
            out_dim, in_dim = module.weight.shape
            if out_dim % DIM_MULTIPLE or in_dim % DIM_MULTIPLE:
                logger.info("float8: skipping %s (weight %dx%d not divisible by %d)", fqn, out_dim, in_dim, DIM_MULTIPLE)
                return False
            if size_filter is not None and not size_filter(module, fqn):
                logger.info("float8: skipping %s (too small to gain: auto_filter_small_kn)", fqn)
                return False
            return not isinstance(module, self._ao.float8_linear_utils.Float8Linear)

        linears = select_linears(
            model, section="float8", fqns=self.config.fqns, filter_fqns=self.config.filter_fqns, eligible=eligible
        )
        return linears + select_experts(self.config, model)

    def torchao_config(self) -> Any:
        """The ``Float8LinearConfig`` this converter applies."""
        base = self._ao.Float8LinearConfig.from_recipe_name(self.config.recipe)
        return dataclasses.replace(
            base,
            emulate=self.settings.emulate,
            enable_fsdp_float8_all_gather=self.settings.enable_fsdp_float8_all_gather,
        )

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        experts = [fqn for fqn in fqns if isinstance(model.get_submodule(fqn), GroupedExperts)]
        if experts:
            convert_experts(model, experts, self.settings.emulate, self.job.device)
        fqns = [fqn for fqn in fqns if fqn not in experts]
        if not fqns:
            return
        wanted = set(fqns)
        self._ao.convert_to_float8_training(
            model, config=self.torchao_config(), module_filter_fn=lambda module, fqn: fqn in wanted
        )
        float8_linear = self._ao.float8_linear_utils.Float8Linear
        missed = [fqn for fqn in fqns if not isinstance(model.get_submodule(fqn), float8_linear)]
        if missed:
            raise ConfigError(f"float8 could not convert {missed}: only nn.Linear modules can be converted to float8")

    def tensor_parallel_styles(self) -> TensorParallelStyles | None:
        # torchao's float8 TP styles implement tensorwise scaling only, and they
        # all-gather float8 activations, which gloo cannot do; otherwise torch's
        # styles shard the Float8Linear weights just as well (with bf16/fp32 collectives).
        if self.config.recipe == "tensorwise" and self.parallel_dims.tp_enabled and self.settings.backend == "nccl":
            from .tp import float8_tp_styles

            return float8_tp_styles()
        return None

    def _precompute_scales(self, model_parts: list[nn.Module]) -> None:
        # One all-reduce for all float8 weights' scales instead of one per layer in the next forward.
        for part in model_parts:
            self._ao.precompute_float8_dynamic_scale_for_fsdp(part)
