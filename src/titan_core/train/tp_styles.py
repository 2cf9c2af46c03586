"""Which tensor-parallel styles a run uses: torch's, or the one converter that supplies its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..errors import ConfigError
from ..plugin.protocols import TensorParallelStyles


class SuppliesStyles(Protocol):
    """A converter, or the plugin facade's guarded view of one (``plugin_boundary.ConverterCalls``)."""

    def tensor_parallel_styles(self) -> TensorParallelStyles | None: ...


def resolve_tp_styles(converters: Sequence[tuple[str, SuppliesStyles]]) -> TensorParallelStyles:
    """The styles of the one converter that supplies TP styles, else torch's defaults.

    Two converters supplying styles is an error rather than "the first wins": the
    styles apply to every linear the TP plan names, so either choice would run some
    converted modules under the other converter's styles.
    """
    supplied = [(name, styles) for name, conv in converters if (styles := conv.tensor_parallel_styles()) is not None]
    if len(supplied) > 1:
        names = ", ".join(name for name, _ in supplied)
        raise ConfigError(
            f"converters {names} each supply their own tensor-parallel styles, and one run can use only one set. "
            f"Use one of them with parallelism.tp > 1, or set parallelism.tp=1."
        )
    return supplied[0][1] if supplied else TensorParallelStyles.default()
