"""``float8.moe_fqns``: which MoE experts run float8 grouped GEMMs, and converting them.

Kept apart from the linear path (``converter.py``): the experts are no ``nn.Linear`` but
``titan_core.moe.GroupedExperts`` with stacked weights, and converting them imports torchao's
MoE training prototype (``experts.py``), which a run without ``moe_fqns`` never needs.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from titan_core import GroupedExperts, select_modules

from .config import Float8Config

logger = logging.getLogger(__name__)

#: both contraction widths of the experts (model dim, expert hidden dim) must be multiples of 16,
#: as for float8 linears (the scaled GEMM's tile; 16-byte rows for torch._grouped_mm in float32)
DIM_MULTIPLE = 16


def select_experts(config: Float8Config, model: nn.Module) -> list[str]:
    """The experts ``moe_fqns`` opts in (none by default); ``filter_fqns`` applies."""
    if not config.moe_fqns:
        return []

    def eligible(fqn: str, experts: GroupedExperts) -> bool:
        _, hidden, dim = experts.w1.shape
        if hidden % DIM_MULTIPLE or dim % DIM_MULTIPLE:
            logger.info("float8: skipping experts %s (dim %d, hidden %d not divisible by %d)", fqn, dim, hidden,
                        DIM_MULTIPLE)
            return False
        return type(experts.w1.data) in (torch.Tensor, nn.Parameter)  # not converted already

    return select_modules(model, GroupedExperts, key="float8.moe_fqns", fqns=config.moe_fqns,
                          filter_fqns=config.filter_fqns, eligible=eligible)


def convert_experts(model: nn.Module, fqns: list[str], emulate: bool, device: torch.device) -> None:
    """Give the experts at ``fqns`` float8 weights: emulated when the linears are, or on a GPU before SM90."""
    from . import experts

    emulate_experts, reason = experts.experts_emulate(emulate, device)
    logger.info("float8: %d MoE expert blocks, %s", len(fqns), reason)
    for fqn in fqns:
        experts.convert_experts(model.get_submodule(fqn), emulate_experts)
