"""Checks the launching process runs before it starts any worker (``--nproc-per-node``).

Every worker would otherwise build the tokenizer and the model before it found a
converter's refusal, and the user would read the same message once per process.
The converters are built here by ``build.build_converters``, which the Trainer's set-up
calls too, from the resolved config the workers also derive (the parallel degrees, rank
0's device, the backend), so their ``__init__`` and ``compatible_with`` checks and the
TP-style rule fail here, once.
"""

from __future__ import annotations

from ..boundary.plugin_boundary import converter_calls
from ..evaluation import load_tasks
from ..parallel import check_experts_split
from ..parallel.expert_tensor_parallel import check_etp_fits
from ..plan.resolve import ResolvedConfig
from .build import build_converters, build_meta_model
from .tp_styles import resolve_tp_styles


def preflight(resolved: ResolvedConfig) -> None:
    """Raise the error a worker would raise for the converters, expert (tensor) parallelism and the eval task files,
    before any worker starts."""
    load_tasks(resolved.config.eval.tasks)
    if resolved.dims.ep_enabled:
        check_ep_fits(resolved)
    if resolved.config.parallelism.etp > 1:
        check_etp_fits(build_meta_model(resolved).model, resolved.config.parallelism.etp,
                       what=f"spec {resolved.spec.name}, flavor {resolved.config.model.flavor}")
    if not resolved.converters:
        return

    checked = converter_calls(build_converters(resolved))
    for calls in checked:
        calls.compatible_with(resolved.spec)
    if resolved.dims.tp_enabled:
        resolve_tp_styles([(calls.name, calls) for calls in checked])


def check_ep_fits(resolved: ResolvedConfig) -> None:
    """parallelism.ep on a model with experts that it divides: checked on the meta model."""
    model = build_meta_model(resolved).model  # the constructor runs through the plugin facade
    check_experts_split(model, resolved.dims.ep,
                        what=f"spec {resolved.spec.name}, flavor {resolved.config.model.flavor}")
