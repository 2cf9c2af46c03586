"""Layout-independent weight init: each parameter from its own (seed, fqn) generator.

A parameter's values depend only on the seed and its name, never on how it is
sharded, which stage holds it, or the device: the full tensor is made on the CPU
and the local shard is cut from it there, so only the shard travels to the device.
Peak extra memory is one full parameter, on the CPU.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..errors import PluginError
from ..runtime.torch_compat import compute_local_shape_and_global_offset


def parameter_generator(seed: int, fqn: str) -> torch.Generator:
    """The generator for parameter ``fqn``; model plugins use the same scheme in init_weights."""
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(fqn.encode())) % 2**63)


@torch.no_grad()
def init_model_weights(model: nn.Module, *, seed: int, buffers_only: bool = False) -> None:
    """Fill every parameter via ``model.init_parameter`` and recompute buffers (after to_empty).

    ``buffers_only``: leave the parameters as they are (their values are about to be
    loaded, e.g. by ``checkpoint.initial_load``), saving the time and the one full
    tensor at a time that filling them costs.
    """
    if not buffers_only:
        _fill_parameters(model, seed)
    init_buffers = getattr(model, "init_buffers", None)
    if init_buffers is not None:
        init_buffers()


def _fill_parameters(model: nn.Module, seed: int) -> None:
    # Part of the model contract (see TrainSpec), which nn.Module's own typing cannot know.
    init_parameter: Callable[[str, torch.Tensor, torch.Generator], None] | None = getattr(model, "init_parameter", None)
    if init_parameter is None:
        # A model written for another trainer often has init_weights() instead: say what the contract wants.
        raise PluginError(
            f"model class {type(model).__name__} has no init_parameter(fqn, tensor, generator) method. The core "
            f"fills every parameter through it, from a generator seeded by (seed, parameter name), so that the "
            f"first weights are the same on every layout; define it (docs/writing-a-train-spec.md, section 4, "
            f'"The model contract").'
        )
    # Parameter names are the model's own: the core's activation checkpointing, compile,
    # FSDP2, TP and pipeline split all keep them, so the seed of each stays the same.
    for fqn, param in model.named_parameters():
        full = torch.empty(param.shape, dtype=torch.float32)
        init_parameter(fqn, full, parameter_generator(seed, fqn))
        if isinstance(param, DTensor):
            block = local_block(param)
            if block is not None:  # the shard is one block of the whole: cut on the CPU, copy only it
                param.to_local().copy_(full[block])
                continue
            # Every rank computed the same full tensor, so no broadcast is needed (src_data_rank=None).
            shard = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(shard.to_local())
        else:
            param.copy_(full)


def local_block(param: DTensor) -> tuple[slice, ...] | None:
    """Where this rank's shard of ``param`` sits in the whole tensor, as slices; None when it is not one
    block (then ``distribute_tensor`` cuts it), or torch lacks the private helper that says it."""
    found = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if found is None:
        return None
    shape, offset = found
    if tuple(shape) != tuple(param.to_local().shape):
        return None
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))
