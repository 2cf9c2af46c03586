"""Expert parallelism (``parallelism.ep``) for any model built from ``titan_core.moe``.

Applied by the core to every :class:`~titan_core.moe.GroupedExperts` module, so a MoE
plugin writes no parallelism code. On the meta model, before activation checkpointing:

* each stacked expert weight ``[E, ...]`` becomes a DTensor sharded on dim 0 over the
  ``ep`` mesh: rank j of an EP group holds experts ``j*E/ep .. (j+1)*E/ep - 1``;
* the module's forward sends its tokens to their experts' ranks and back
  (``token_exchange``); parameter names do not change.

FSDP2 then shards those local experts over the ``expert_dp_shard`` (and ``dp_replicate``)
ranks (:func:`shard_experts`), while every other parameter is sharded over all
data-parallel ranks as without EP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config.parallel_dims import ParallelDims
from ..errors import ConfigError
from ..moe import GroupedExperts
from .token_exchange import exchange_through_experts


def experts_modules(model: nn.Module) -> list[tuple[str, GroupedExperts]]:
    """Every ``titan_core.moe`` experts module of ``model``, by name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, GroupedExperts)]


def dense_model_error(ep: int, what: str) -> ConfigError:
    return ConfigError(
        f"parallelism.ep={ep} splits the experts of MoE layers over ranks, but {what} has no experts "
        f"(no titan_core.moe experts module: a dense model or flavor). Set parallelism.ep=1, or pick a MoE "
        f"flavor (e.g. --flavor debugmoe with --spec qwen3)."
    )


def check_experts_split(model: nn.Module, ep: int, *, what: str) -> list[tuple[str, GroupedExperts]]:
    """The experts modules of ``model`` (on meta is enough), refused when there are none or ``ep``
    does not divide a layer's experts. Also run by the launcher before any worker starts."""
    found = experts_modules(model)
    if not found:
        raise dense_model_error(ep, what)
    for name, experts in found:
        if experts.num_experts % ep:
            raise ConfigError(
                f"parallelism.ep={ep} does not divide the {experts.num_experts} experts of {name} ({what}): each "
                f"rank of an expert-parallel group holds an equal share of every MoE layer's experts. Choose an ep "
                f"that divides {experts.num_experts}."
            )
    return found


def apply_expert_parallel(model: nn.Module, ep_mesh: Any, *, what: str = "this model") -> list[str]:
    """Split every experts module's stacked weights over ``ep_mesh`` and route tokens to them; returns their names."""
    from torch.distributed.tensor import Shard, distribute_tensor

    found = check_experts_split(model, ep_mesh.size(), what=what)
    group = ep_mesh.get_group()
    for _, experts in found:
        for pname, param in list(experts.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)])
            experts.register_parameter(pname, nn.Parameter(sharded, requires_grad=param.requires_grad))
        route_through_ranks(experts, group)
    return [name for name, _ in found]


def route_through_ranks(experts: GroupedExperts, group: Any) -> None:
    """Make ``experts``' forward send its tokens to their experts' ranks in ``group`` and back."""
    local = experts.forward  # the module's own computation, on this rank's experts

    def forward(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return exchange_through_experts(x, counts, local, group)

    # An instance attribute shadows the class's forward; the hooks FSDP2 adds run around it.
    experts.forward = forward  # type: ignore[method-assign]
    experts._titan_expert_parallel = True  # type: ignore[assignment]  # read by check_expert_parallel


def shard_experts(experts: nn.Module, *, mesh: Any, mp_policy: Any, reshard_after_forward: bool, dp: int) -> None:
    """FSDP2 over ``mesh`` (the expert data-parallel ranks) for one EP-split experts module.

    The shards are taken on dim 1 where it splits evenly (FSDP2's rule for dims other than
    0): dim 0 is already split by EP, and splitting it again would leave a rank's piece
    strided in the full tensor (and empty when a rank holds fewer experts than ``mesh`` has
    ranks); dim 1 keeps every piece a box.
    Gradients: each rank's loss is already scaled for the mean over all ``dp`` ranks, and the
    all-to-all backward has summed the contributions of the EP group into the expert's
    rank, so the reduce is a sum over ``mesh`` divided by ``dp`` (not by ``mesh``'s size).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    shard_size = mesh.size(-1)  # the reduce-scatter ranks (the last dim under HSDP)

    def placement(param: torch.Tensor) -> Shard:
        # FSDP2 wants dim 1 to split evenly; else dim 0 (a strided piece, still correct).
        return Shard(1) if param.dim() > 1 and param.shape[1] % shard_size == 0 else Shard(0)

    module: Any = fully_shard(experts, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward,
                              shard_placement_fn=placement)
    module.set_gradient_divide_factor(float(dp))
    # A custom divisor means PREMUL_SUM, which gloo refuses: sum, then divide. Only with a real
    # reduce-scatter: with one shard rank torch 2.13 already divides when it copies the
    # gradient, and forcing the sum would divide a second time.
    if mesh.device_type == "cpu" and shard_size > 1:
        module.set_force_sum_reduction_for_comms(True)


def check_expert_parallel(model_parts: list[nn.Module], dims: ParallelDims, *, what: str) -> None:
    """With ep > 1, every experts module was split by EP (a spec's own parallelize_fn must call
    ``apply_expert_parallel``); a model without experts is refused. A pipeline stage may hold
    dense layers only: there the whole model was checked before the split
    (:func:`check_experts_split`)."""
    if not dims.ep_enabled:
        return
    found = [(name, m) for part in model_parts for name, m in experts_modules(part)]
    if not found and not dims.pp_enabled:
        raise dense_model_error(dims.ep, what)
    missed = [name for name, m in found if not getattr(m, "_titan_expert_parallel", False)]
    if missed:
        raise ConfigError(
            f"parallelism.ep={dims.ep}: {what}'s parallelize_fn left the experts of {missed[0]} unsplit. A spec "
            f"with its own parallelize_fn applies titan_core.parallel.apply_expert_parallel (before FSDP2), or "
            f"uses the default one; until then set parallelism.ep=1."
        )
