"""Muon for the weight matrices, AdamW for everything else, in one torch optimizer.

Muon (Jordan et al. 2024; Liu et al. 2025, "Muon is scalable for LLM training") keeps
SGD momentum for a weight matrix and applies, instead of the momentum itself, its nearest
semi-orthogonal matrix: every singular value set to ~1, found by a few Newton-Schulz
iterations. Embeddings, the output head, norm scales and biases are not matrices that act
on a hidden state in that sense, so they keep AdamW (``param_groups.split_for_muon`` picks
them from the model's structure). Each torch param group carries ``use_muon``.

The update is scaled by ``0.2 * sqrt(max(rows, cols))``, which gives it about the RMS of an
AdamW update (Liu et al.): the same learning rate and weight decay then suit both rules.

Sharded weights (FSDP2, tensor parallelism: DTensors) are orthogonalised whole. Each rank
gathers the full momentum-updated matrix, runs the same iterations on the same numbers, and
keeps its own shard of the result. That costs one all-gather of each matrix per step (what
FSDP2's forward gathers anyway) and the iterations are repeated on every rank; in exchange
the update is exactly the one-process update, whatever the layout.

A 3-d parameter (grouped MoE experts, ``[experts, rows, cols]``) is one matrix per expert,
orthogonalised as a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["Muon", "newton_schulz"]

# The quintic iteration's coefficients (Jordan et al.): chosen to push singular values in
# (0, 1] towards 1 quickly; they need not converge exactly (about 0.7-1.2 is what Muon wants).
_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(matrix: torch.Tensor, steps: int) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with the singular vectors of ``matrix`` (float32;
    batched over leading dimensions)."""
    a, b, c = _NS_COEFFICIENTS
    x = matrix.float()
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # iterate on the wide side: X X^T is then the smaller product
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # every singular value <= 1
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    out: torch.Tensor = x.mT if tall else x
    return out


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor of a DTensor (a collective), the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        whole: torch.Tensor = tensor.full_tensor()
        return whole
    return tensor


def _like(whole: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``whole`` laid out as ``param``: this rank's shard of it for a DTensor (no communication:
    every rank holds the same whole), ``whole`` itself otherwise."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(param, DTensor):
        return whole
    mesh = param.device_mesh
    replicated = DTensor.from_local(whole, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return replicated.redistribute(mesh, param.placements)


class Muon(torch.optim.Optimizer):
    """Muon on the groups with ``use_muon=True``, AdamW (decoupled weight decay) on the others."""

    def __init__(self, params: Iterable[Any], *, lr: float, weight_decay: float, betas: tuple[float, float],
                 eps: float, momentum: float, nesterov: bool, ns_steps: int) -> None:
        defaults = {"lr": lr, "weight_decay": weight_decay, "betas": betas, "eps": eps, "momentum": momentum,
                    "nesterov": nesterov, "ns_steps": ns_steps, "use_muon": False}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if group["use_muon"]:
                    self._muon(param, group)
                else:
                    self._adamw(param, group)

    def _muon(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        grad = param.grad
        assert grad is not None
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        buffer = state["momentum_buffer"]
        momentum = group["momentum"]
        buffer.lerp_(grad, 1 - momentum)
        update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
        whole = newton_schulz(_whole(update), group["ns_steps"])
        rows, cols = whole.shape[-2:]
        whole = whole * (0.2 * math.sqrt(max(rows, cols)))
        param.mul_(1 - group["lr"] * group["weight_decay"])
        param.add_(_like(whole.to(param.dtype), param), alpha=-group["lr"])

    def _adamw(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        grad = param.grad
        assert grad is not None
        state = self.state[param]
        if "step" not in state:
            # A float32 tensor step on the host, as torch's AdamW keeps it (DCP saves tensors).
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        step = float(state["step"])
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        param.mul_(1 - group["lr"] * group["weight_decay"])
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-group["lr"] / (1 - beta1 ** step))
