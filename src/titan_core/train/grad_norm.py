"""Gradient norm and clipping that are correct under DTensor sharding and pipelining."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def total_grad_norm(model_parts: list[nn.Module], *, pp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """2-norm of all gradients of all parts on all ranks.

    A DTensor norm is already global over its mesh (full_tensor of the partial
    norm); pipeline stages hold disjoint parameters, so their squared norms add up
    across the pipeline group.
    """
    grads = [p.grad for part in model_parts for p in part.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    # Each tensor's norm accumulates in float64: torch's float32 CPU norm sums sequentially
    # and loses ~1e-4 relative on a 0.5M-element gradient, more than the layouts differ by.
    # A DTensor norm reduces over its own mesh, and DTensors of different meshes do not mix in
    # one op: a TP plan may leave some parameters plain (replicated on every tp rank, e.g. a
    # norm without sequence parallelism), and EP's experts live on another mesh than the dense
    # weights. Each kind is normed apart, then combined.
    kinds: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        kinds.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    norms = [_norm_of(kind) for kind in kinds.values()]
    norm = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms), 2.0)
    if pp_group is not None:
        squared = norm.pow(2)
        dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=pp_group)
        norm = squared.sqrt()
    total: torch.Tensor = norm.float()
    return total


def _norm_of(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of ``grads`` (all DTensors or all plain), as a plain float64 scalar."""
    per_tensor = [torch.linalg.vector_norm(g, 2.0, dtype=torch.float64) for g in grads]
    norm = torch.linalg.vector_norm(torch.stack(per_tensor), 2.0)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm  # a plain tensor either way


def clip_grad_norm_on_device(model_parts: list[nn.Module], max_norm: float, *,
                             pp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """Clip in place to ``max_norm`` (0 = only measure); returns the norm before clipping, on the device.

    Nothing is copied to the host: a non-finite norm scales the gradients to NaN or zero,
    and the Trainer refuses or skips that step before or after it (finite_watch.py)."""
    norm = total_grad_norm(model_parts, pp_group=pp_group)
    if max_norm > 0:
        params = [p for part in model_parts for p in part.parameters() if p.grad is not None]
        # foreach kernels take all plain tensors or all DTensors of one mesh, not a mix.
        groups: dict[object, list[nn.Parameter]] = {}
        for p in params:
            groups.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
        for group in groups.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
    return norm


def clip_grad_norm(model_parts: list[nn.Module], max_norm: float, *, pp_group: dist.ProcessGroup | None) -> float:
    """``clip_grad_norm_on_device``, with the norm read on the host."""
    return float(clip_grad_norm_on_device(model_parts, max_norm, pp_group=pp_group))


@torch.no_grad()
def scale_gradients(model_parts: list[nn.Module], factor: float) -> None:
    """Multiply every gradient of ``model_parts`` by ``factor`` in place (1: nothing to do)."""
    if factor == 1:
        return
    for part in model_parts:
        for param in part.parameters():
            if param.grad is not None:
                param.grad.mul_(factor)
