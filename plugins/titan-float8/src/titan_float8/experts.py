"""Float8 for MoE experts: swap the stacked expert weights for a tensor that runs float8 grouped GEMMs.

``titan_core.moe.GroupedExperts`` sends any weight of a tensor subclass through
``torch._grouped_mm``; the subclass intercepts that call (``__torch_function__``). Two subclasses,
both torchao's ``Float8TrainingWeightWrapperTensor`` underneath (so FSDP2, DTensor and the
optimizer see one tensor type and its all-gather hooks):

* emulated (CPU, or a GPU without float8 grouped GEMM kernels): ``EmulatedFloat8ExpertWeight``,
  whose grouped GEMM is ``grouped_mm.emulated_float8_grouped_mm`` (float32, same numerics);
* real kernels (CUDA SM90+): torchao's own wrapper, whose grouped GEMM is torchao's
  ``fp8_rowwise`` recipe (Triton + ``torch._scaled_grouped_mm``). UNTESTED here: this project's
  CI has no GPU.

torchao is imported by this module, which the converter imports only when experts are selected.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchao.prototype.moe_training.config import Float8TrainingOpConfig
from torchao.prototype.moe_training.tensor import Float8TrainingWeightWrapperTensor
from torchao.prototype.moe_training.utils import unwrap_weight

from titan_core.runtime.torch_compat import torch_function_subclass_disabled

from . import hardware
from .grouped_mm import emulated_float8_grouped_mm

#: the stacked weights of a GroupedExperts (gate, down, up)
EXPERT_WEIGHTS = ("w1", "w2", "w3")
#: torch._scaled_grouped_mm (torchao's float8 grouped GEMM) runs on Hopper and newer
MIN_GROUPED_CAPABILITY = (9, 0)


class EmulatedFloat8ExpertWeight(Float8TrainingWeightWrapperTensor):
    """An expert weight whose grouped GEMMs run float8 rowwise, emulated in float32.

    Only ``torch._grouped_mm(tokens, weight, offs=...)`` (how experts use their weights) is
    rewritten; every other op sees the high-precision weight, as for torchao's wrapper.
    """

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "_grouped_mm" and len(args) >= 2:
            x, weight, offs = args[0], args[1], kwargs.get("offs")
            if isinstance(weight, cls) and not isinstance(x, cls) and x.ndim == 2 and weight.ndim == 3 \
                    and offs is not None:
                return emulated_float8_grouped_mm(x, unwrap_weight(weight), offs)
        with torch_function_subclass_disabled():
            return func(*args, **kwargs)


def expert_weight_class(emulate: bool) -> type[Float8TrainingWeightWrapperTensor]:
    """The wrapper for the experts: emulated, or torchao's real float8 grouped GEMM (untested)."""
    return EmulatedFloat8ExpertWeight if emulate else Float8TrainingWeightWrapperTensor


def convert_experts(experts: nn.Module, emulate: bool) -> None:
    """Swap ``experts``' stacked weights (in place, same names) for float8 expert weights."""
    wrapper = expert_weight_class(emulate)
    # torchao's default output dtype is bfloat16; the core casts the result back to the input's dtype.
    config = Float8TrainingOpConfig()
    for name in EXPERT_WEIGHTS:
        param = getattr(experts, name)
        setattr(experts, name, nn.Parameter(wrapper(param.data, config), requires_grad=param.requires_grad))


def experts_emulate(emulate: bool, device: torch.device) -> tuple[bool, str]:
    """(emulate the experts' grouped GEMMs?, why), given whether float8 linears are emulated on ``device``."""
    if emulate:
        return True, "experts emulated (float32 grouped GEMM)"
    major, minor = hardware.cuda_capability(device)
    if (major, minor) < MIN_GROUPED_CAPABILITY:
        return True, f"experts emulated: torch._scaled_grouped_mm needs sm_90+, this GPU is sm_{major}{minor}"
    return False, f"experts on torchao's float8 rowwise grouped GEMM (sm_{major}{minor}; untested in CI)"
