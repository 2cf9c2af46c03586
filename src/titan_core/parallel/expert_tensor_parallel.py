"""Expert tensor parallelism (``parallelism.etp``): each expert's SwiGLU split over the tp ranks.

Under plain TP a MoE block is replicated: every tp rank all-gathers the sequence, routes the
same tokens and runs every expert whole. With ``etp = tp`` each rank keeps a slice of every
expert's hidden width instead, as a dense MLP is split (column-wise in, row-wise out):

* ``w1`` / ``w3`` ``[E, hidden, dim]`` become DTensors ``Shard(1)`` over ``mesh["tp"]``,
  ``w2`` ``[E, dim, hidden]`` ``Shard(2)``: a rank holds ``hidden / tp`` of each expert;
* the experts' forward computes each token's output from its own slice, a partial sum, and
  adds the slices over tp (an all-reduce); in backward the gradient of the tokens is summed
  over tp the same way, since each slice contributes its own part of it.

The router and any shared experts stay replicated, so routing (and each rank's tokens) is the
same on every tp rank, as without ETP. Parameter names do not change; DCP reshards the
slices between etp degrees like any DTensor. Expert memory per rank: 1/tp of plain TP's.

With expert parallelism too (``ep > 1``), each weight is one DTensor on the 2-D ``(ep, tp)`` mesh,
``[Shard(0), Shard(hidden)]``: a rank holds ``hidden / tp`` of ``E / ep`` experts. Each tp slice
exchanges its tokens over its own ep group (tp ranks route the same tokens, so the ranks of one ep
index receive the same ones), computes its hidden slice of its experts, and adds the slices over tp
before the tokens go back. FSDP2 shards each weight further over ``expert_dp_shard``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..moe import GroupedExperts
from .expert_parallel import check_experts_split, experts_modules, route_through_ranks

# Which dimension of each stacked weight holds the experts' hidden width.
_HIDDEN_DIM = {"w1": 1, "w3": 1, "w2": 2}


def apply_expert_tensor_parallel(model: nn.Module, tp_mesh: Any, *, what: str = "this model") -> list[str]:
    """Split every experts module's hidden width over ``tp_mesh`` (module docstring); returns their names."""
    from torch.distributed.tensor import Shard, distribute_tensor

    found = check_etp_fits(model, tp_mesh.size(), what=what)
    for name, experts in found:
        for pname, dim in _HIDDEN_DIM.items():
            param = _plain_weight(experts, pname, name, etp=tp_mesh.size())
            sharded = distribute_tensor(param.data, tp_mesh, [Shard(dim)])
            experts.register_parameter(pname, nn.Parameter(sharded, requires_grad=param.requires_grad))
        _sum_slices_over(experts, tp_mesh.get_group())
    return [name for name, _ in found]


def apply_expert_and_tensor_parallel(model: nn.Module, ep_tp_mesh: Any, *, what: str = "this model") -> list[str]:
    """EP and ETP at once (module docstring): every experts module split over the 2-D ``(ep, tp)`` mesh, its
    tokens exchanged over ``ep`` and its hidden slices summed over ``tp``; returns their names."""
    from torch.distributed.tensor import Shard, distribute_tensor

    ep_mesh, tp_mesh = ep_tp_mesh["ep"], ep_tp_mesh["tp"]
    check_experts_split(model, ep_mesh.size(), what=what)
    found = check_etp_fits(model, tp_mesh.size(), what=what)
    for name, experts in found:
        for pname, dim in _HIDDEN_DIM.items():
            param = _plain_weight(experts, pname, name, etp=tp_mesh.size())
            sharded = distribute_tensor(param.data, ep_tp_mesh, [Shard(0), Shard(dim)])
            experts.register_parameter(pname, nn.Parameter(sharded, requires_grad=param.requires_grad))
        _sum_slices_over(experts, tp_mesh.get_group())  # inside: on the tokens this rank's experts receive
        route_through_ranks(experts, ep_mesh.get_group())
    return [name for name, _ in found]


def _plain_weight(experts: GroupedExperts, pname: str, name: str, *, etp: int) -> nn.Parameter:
    param: nn.Parameter = getattr(experts, pname)
    if type(param.data) is not torch.Tensor:  # a converter's weight subclass (float8, MX)
        raise ConfigError(
            f"parallelism.etp={etp}: the experts of {name} were converted ({type(param.data).__name__} weights), and "
            f"splitting converted experts over tp is not supported yet. Leave the experts out of the converter "
            f"(e.g. mx.moe_fqns=[]), or set parallelism.etp=1."
        )
    return param


def check_etp_fits(model: nn.Module, etp: int, *, what: str) -> list[tuple[str, GroupedExperts]]:
    """The experts modules of ``model`` (on meta is enough), refused when there are none or ``etp`` does not
    divide an expert's hidden width. Also run by the launcher before any worker starts."""
    found = experts_modules(model)
    if not found:
        raise ConfigError(
            f"parallelism.etp={etp} splits each expert of the MoE layers over the tp ranks, but {what} has no "
            f"experts (no titan_core.moe experts module: a dense model or flavor). Set parallelism.etp=1, or pick a "
            f"MoE flavor (e.g. --flavor debugmoe with --spec qwen3)."
        )
    for name, experts in found:
        hidden = experts.w1.shape[1]
        if hidden % etp:
            raise ConfigError(
                f"parallelism.etp={etp} does not divide the experts' hidden width {hidden} of {name} ({what}): each "
                f"tp rank holds an equal slice of every expert. Choose a tp degree that divides {hidden}, or set "
                f"parallelism.etp=1 (experts replicated over tp)."
            )
    return found


def _sum_slices_over(experts: GroupedExperts, group: Any) -> None:
    local = experts.forward  # the module's own computation, on this rank's slice of every expert

    def forward(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        # torch leaves Function.apply untyped
        partial = local(_SumGradient.apply(x, group), counts)  # type: ignore[no-untyped-call]
        out: torch.Tensor = _SumValue.apply(partial, group)  # type: ignore[no-untyped-call]
        return out

    # An instance attribute shadows the class's forward; the hooks FSDP2 adds run around it.
    experts.forward = forward  # type: ignore[method-assign]
    experts._titan_expert_tensor_parallel = True  # type: ignore[assignment]  # read by check_expert_tensor_parallel


def _all_reduced(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    import torch.distributed as dist

    total = tensor.contiguous().clone()
    dist.all_reduce(total, group=group)
    return total


class _SumGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the tp ranks (each slice's contribution)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduced(grad, ctx.group), None


class _SumValue(torch.autograd.Function):
    """Forward sums the slices' partial outputs over the tp ranks; backward passes the (replicated) gradient."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, group: Any) -> torch.Tensor:
        return _all_reduced(partial, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def check_expert_tensor_parallel(model_parts: list[nn.Module], etp: int, *, what: str) -> None:
    """With etp > 1, every experts module was split by ETP (a spec's own parallelize_fn must call
    ``apply_expert_tensor_parallel``)."""
    if etp <= 1:
        return
    missed = [name for part in model_parts for name, m in experts_modules(part)
              if not getattr(m, "_titan_expert_tensor_parallel", False)]
    if missed:
        raise ConfigError(
            f"parallelism.etp={etp}: {what}'s parallelize_fn left the experts of {missed[0]} whole. A spec with its "
            f"own parallelize_fn applies titan_core.parallel.apply_expert_tensor_parallel (after its TP plan, "
            f"before FSDP2), or uses the default one; until then set parallelism.etp=1."
        )
