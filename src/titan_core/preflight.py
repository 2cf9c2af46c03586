"""Checks the launching process runs before it starts any worker (``--nproc-per-node``).

Every worker would otherwise build the tokenizer and the model before it found a
converter's refusal, and the user would read the same message once per process.
The converters are built here by the Trainer's own ``build_converters`` from the
resolved config the workers also derive (the parallel degrees, rank 0's device, the
backend), so their ``__init__`` and ``compatible_with`` checks and the TP-style rule
fail here, once.
"""

from __future__ import annotations

from .plan.resolve import ResolvedConfig
from .plugin_boundary import ConverterCalls
from .trainer import Trainer


def preflight(resolved: ResolvedConfig) -> None:
    """Raise the error a worker would raise for the converters, before any worker starts."""
    if not resolved.converters:
        return

    trainer = Trainer(resolved)
    for name, conv in trainer.build_converters():
        ConverterCalls(name, conv).compatible_with(resolved.spec)
    if resolved.dims.tp_enabled:
        trainer.tp_styles()
