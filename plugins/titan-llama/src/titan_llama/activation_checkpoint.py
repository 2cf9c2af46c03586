"""Activation checkpointing of transformer blocks that keeps parameter names unchanged.

``checkpoint_wrapper`` nests each block under ``_checkpoint_wrapped_module``,
which changes ``named_parameters()`` (and with it the per-parameter init seeds
and optimizer-state keys). Instead, the block's own ``forward`` is replaced by
one that runs the original under non-reentrant ``torch.utils.checkpoint``: the
module tree, and so every fully qualified name, stays as it was.

Modes:
  * ``full``: every block recomputes all of its activations in backward;
  * ``selective`` with ``selective_every = N``: every Nth block (by global layer
    id, so the choice does not depend on the pipeline split) is fully checkpointed;
  * ``selective`` with ``selective_every = 0``: per-op; outputs of the ops in
    ``selective_save_ops`` are kept, everything else is recomputed. Matmuls
    (``aten.mm.default``) are special: only every other one is kept, halving
    their memory at the cost of recomputing the others.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from titan_core import ActivationCheckpointSection, ConfigError

from . import cpu_attention  # noqa: F401  (registers torch.ops.titan_llama.causal_attention)


def resolve_ops(names: list[str]) -> list[Any]:
    """Turn names like ``aten.mm.default`` into op overloads; unknown names are ConfigErrors."""
    ops = []
    for name in names:
        parts = name.split(".")
        op: Any = None
        if len(parts) == 3:
            try:
                op = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
            except (AttributeError, RuntimeError):
                op = None
        if op is None:
            raise ConfigError(
                f'activation_checkpoint.selective_save_ops: "{name}" is not an operator overload '
                f'of this torch build. Write names as "<namespace>.<op>.<overload>", e.g. "aten.mm.default".'
            )
        ops.append(op)
    return ops


def _with_fused_attention(save_ops: list[Any]) -> list[Any]:
    """Save the fused CPU attention op wherever an SDPA kernel is saved.

    It is this model's attention where SDPA is not used, so the default list (which names
    the SDPA kernels) keeps attention outputs on every path.
    """
    sdpa = {
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
    fused = torch.ops.titan_llama.causal_attention.default
    if sdpa & set(save_ops) and fused not in save_ops:
        return [*save_ops, fused]
    return save_ops


def _selective_context_fn(save_ops: list[Any]) -> Callable[[], Any]:
    """A ``context_fn`` for checkpoint() that saves ``save_ops`` outputs (every other mm)."""
    save = set(save_ops)
    mm = torch.ops.aten.mm.default

    def make_contexts() -> Any:
        # One counter per forward and per recompute: both must make the same choice
        # for the n-th matmul, so they count separately.
        counts: dict[str, int] = defaultdict(int)

        def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            if op is mm and mm in save:
                key = "recompute" if ctx.is_recompute else "forward"
                counts[key] += 1
                keep = counts[key] % 2 == 1
                return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return make_contexts


def checkpoint_module(module: nn.Module, context_fn: Callable[[], Any] | None = None) -> None:
    """Make ``module``'s forward recompute in backward, without changing the module tree."""
    inner = module.forward
    kwargs: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": True}
    if context_fn is not None:
        kwargs["context_fn"] = context_fn

    @functools.wraps(inner)
    def forward(*args: Any, **fw_kwargs: Any) -> Any:
        return checkpoint(inner, *args, **kwargs, **fw_kwargs)

    # An instance attribute shadows the class's forward; nn.Module.__call__ (and
    # the hooks FSDP2 adds later) still run around it.
    module.forward = forward  # type: ignore[method-assign]
    module._titan_checkpointed = True  # type: ignore[assignment]


def apply_activation_checkpointing(layers: nn.ModuleDict, ac: ActivationCheckpointSection) -> list[str]:
    """Checkpoint the blocks in ``layers`` per ``ac``; returns the layer names it checkpointed."""
    if ac.mode == "none":
        return []
    context_fn: Callable[[], Any] | None = None
    every = 1
    if ac.mode == "selective":
        if ac.selective_every > 0:
            every = ac.selective_every
        else:
            context_fn = _selective_context_fn(_with_fused_attention(resolve_ops(ac.selective_save_ops)))
    done = []
    for name, block in layers.items():
        # Global layer ids: the same blocks are checkpointed whatever the pipeline split.
        if (int(name) + 1) % every == 0:
            checkpoint_module(block, context_fn)
            done.append(name)
    return done
