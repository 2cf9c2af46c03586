"""Checks the launching process runs before it starts any worker (``--nproc-per-node``).

Every worker would otherwise build the tokenizer and the model before it found a
converter's refusal, and the user would read the same message once per process.
The converters are built here from the same inputs the workers give them (the
parallel degrees, rank 0's device, the backend), so their ``__init__`` and
``compatible_with`` checks and the TP-style rule fail here, once.
"""

from __future__ import annotations

from .config.resolve import ResolvedConfig
from .distributed import pick_device
from .parallel_dims import ParallelDims
from .protocols import ModelConverter, RunContext
from .tp_styles import resolve_tp_styles


def build_converters(resolved: ResolvedConfig, dims: ParallelDims) -> list[tuple[str, ModelConverter]]:
    """The requested converters, constructed as rank 0 will construct them."""
    c = resolved.config
    device = pick_device(c.training.device, 0)
    p = c.parallelism
    backend = p.backend if p.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    ctx = RunContext(device, backend, c.training, c.parallelism, c.compile)
    return [(name, cls(getattr(c, name), parallel_dims=dims, job=ctx)) for name, cls in resolved.converters]


def preflight(resolved: ResolvedConfig) -> None:
    """Raise the error a worker would raise for the converters, before any worker starts."""
    if not resolved.converters:
        return
    p = resolved.config.parallelism
    dims = ParallelDims.resolve(dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, tp=p.tp, pp=p.pp,
                                world_size=resolved.world_size)
    converters = build_converters(resolved, dims)
    from .discovery import CONVERTERS
    from .plugin_calls import plugin_call

    for name, conv in converters:
        with plugin_call(CONVERTERS, name, "compatible_with()"):
            conv.compatible_with(resolved.spec)
    if dims.tp_enabled:
        resolve_tp_styles(converters)
