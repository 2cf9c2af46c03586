"""Checks the launching process runs before it starts any worker (``--nproc-per-node``).

Every worker would otherwise build the tokenizer and the model before it found a
converter's refusal, and the user would read the same message once per process.
The converters are built here by ``build.build_converters``, which the Trainer's set-up
calls too, from the resolved config the workers also derive (the parallel degrees, rank
0's device, the backend), so their ``__init__`` and ``compatible_with`` checks and the
TP-style rule fail here, once.
"""

from __future__ import annotations

from .build import build_converters
from .discovery import CONVERTERS
from .plan.resolve import ResolvedConfig
from .plugin_calls import plugin_call
from .tp_styles import resolve_tp_styles


def preflight(resolved: ResolvedConfig) -> None:
    """Raise the error a worker would raise for the converters, before any worker starts."""
    if not resolved.converters:
        return

    named = build_converters(resolved)
    for name, conv in named:
        with plugin_call(CONVERTERS, name, "compatible_with()"):
            conv.compatible_with(resolved.spec)
    if resolved.dims.tp_enabled:
        resolve_tp_styles(named)
