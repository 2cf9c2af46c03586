"""Int8FakeConverter: the ModelConverter that swaps selected linears for Int8FakeQuantLinear."""

from __future__ import annotations

from torch import nn

from titan_core import ModelConverter, select_linears

from .config import Int8FakeConfig
from .layer import Int8FakeQuantLinear


class Int8FakeConverter(ModelConverter[Int8FakeConfig]):
    """Fake-quantized int weights (straight-through estimator) for the selected nn.Linear layers.

    The type argument is the config: the core validates the ``[int8fake]`` section with
    ``Int8FakeConfig`` and ``self.config`` is one (no ``Config =`` or ``__init__`` needed).
    """

    plugin_api_version = "1.0"  # the titan-core plugin API this converter was written for

    def selection_keys(self) -> list[str]:
        return ["fqns", "filter_fqns"]

    def select(self, model: nn.Module) -> list[str]:
        # The core's selection helper: the same fqns / filter_fqns rule as titan-float8 and mx.
        return select_linears(
            model, section="int8fake", fqns=self.config.fqns, filter_fqns=self.config.filter_fqns,
            eligible=lambda fqn, module: not isinstance(module, Int8FakeQuantLinear),
        )

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            parent_name, _, child = fqn.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, Int8FakeQuantLinear.from_linear(getattr(parent, child), self.config.bits))
