"""The live state a peer sends holds each rank's local shards; these put them back as DTensors.

A replica group with FSDP2 (or TP) inside has DTensor weights and optimizer state. Rank r of a
rejoining group receives the state of rank r of a live peer, which has the same layout, so the
local shards are all that needs to travel (plain tensors: what ``weights_only`` loading accepts).
"""

from __future__ import annotations

from typing import Any

import torch


def local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def local_tree(value: Any) -> Any:
    """``value`` with every DTensor in its dicts and lists replaced by its local shard."""
    if isinstance(value, torch.Tensor):
        return local(value)
    if isinstance(value, dict):
        return {k: local_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [local_tree(v) for v in value]
    return value


def redistribute_optimizer_state(optimizers: list[torch.optim.Optimizer]) -> None:
    """After ``load_state_dict`` of local shards: each state tensor of a DTensor parameter (Adam's
    moments; not its scalar step) becomes a DTensor laid out like that parameter again."""
    from torch.distributed.tensor import DTensor

    for opt in optimizers:
        for param, state in opt.state.items():
            if not isinstance(param, DTensor):
                continue
            shard = param.to_local()
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.shape == shard.shape \
                        and value.dim() > 0:
                    state[key] = DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                                                    shape=param.shape, stride=param.stride())
