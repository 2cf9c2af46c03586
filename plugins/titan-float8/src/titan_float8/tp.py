"""Float8-aware tensor-parallel styles (tensorwise recipe, nccl) that fall back per module.

torchao's ``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` refuse modules
that are not ``Float8Linear``, and ``PrepareFloat8ModuleInput`` hands float8
activations to every consumer. A spec applies one set of styles to all the
blocks' linears, but with ``--converters float8,mx`` (or a ``filter_fqns``)
some of them are not float8. So each style here checks the module it is applied
to and uses torch's plain style, with the same layouts, where float8 does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from titan_core import TensorParallelStyles

# PrepareFloat8ModuleInput arguments that torch's PrepareModuleInput does not take.
_FLOAT8_ONLY_KWARGS = ("float8_dtype", "fwd_config_submodule_fqn")


def _with_fallback(float8_style: type, plain_style: type, fits: Callable[[nn.Module], bool]) -> type:
    class Style(float8_style):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._plain_kwargs = {k: v for k, v in kwargs.items() if k not in _FLOAT8_ONLY_KWARGS}

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            if fits(module):
                return super()._apply(module, device_mesh)
            return plain_style(**self._plain_kwargs)._apply(module, device_mesh)

    Style.__name__ = Style.__qualname__ = f"{float8_style.__name__}OrPlain"
    Style.__doc__ = f"{float8_style.__name__} on float8 modules, else torch's {plain_style.__name__}."
    return Style


def float8_tp_styles() -> TensorParallelStyles:
    """Styles that cast to float8 before the TP collectives (fewer bytes moved) where the module is float8."""
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    def is_float8(module: nn.Module) -> bool:
        return isinstance(module, Float8Linear)

    def all_linears_float8(module: nn.Module) -> bool:
        # The input is cast once for all consumers, so every linear inside must take float8.
        linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        return bool(linears) and all(isinstance(m, Float8Linear) for m in linears)

    return TensorParallelStyles(
        colwise=_with_fallback(Float8ColwiseParallel, ColwiseParallel, is_float8),
        rowwise=_with_fallback(Float8RowwiseParallel, RowwiseParallel, is_float8),
        prepare_module_input=_with_fallback(PrepareFloat8ModuleInput, PrepareModuleInput, all_linears_float8),
    )
