"""Layout-independent weight init: each parameter from its own (seed, fqn) generator.

A parameter's values depend only on the seed and its name, never on how it is
sharded, which stage holds it, or the device. Two ways, chosen per parameter:

* whole: the full tensor is made on the CPU and the local shard is cut from it there,
  so only the shard travels to the device. Every rank computes every value of its
  parameters: one 70B FSDP8 x TP8 rank would draw all 70 billion (tens of minutes).
* tiled (sharded init): for a model that declares ``init_is_elementwise = True``
  (its ``init_parameter`` draws each element from a distribution that depends on the
  name only, never on the shape), a parameter larger than ``TILED_ABOVE`` values is
  cut into fixed tiles, each filled by ``init_parameter`` from its own generator
  seeded by (seed, fqn, tile). A rank fills only the tiles its shard touches, so it
  draws about its own share. Tiles are fixed by the full shape, never by the layout,
  so every layout (and one process) gets the same values.

Small parameters stay whole, so their values are those of earlier releases.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..errors import PluginError
from ..runtime.torch_compat import compute_local_shape_and_global_offset

# A parameter of more values than this is tiled when its model allows it; below it the whole tensor
# costs well under a second to draw, and its values stay what earlier releases gave.
TILED_ABOVE = 1 << 20
# Tile edges: 32 rows x 512 columns of the last two dimensions (one index of any leading one), or 16384
# values of a vector. Shards of real layouts cut rows in multiples of 32 and columns in multiples of 512
# (heads x head_dim, ffn widths), so a shard rarely draws more than its own values; small tiles cost a
# generator each (~0.2 ms of Python per tile of a truncated normal).
TILE_ROWS, TILE_COLUMNS, TILE_VECTOR = 32, 512, 16384


def parameter_generator(seed: int, fqn: str) -> torch.Generator:
    """The generator for parameter ``fqn``; model plugins use the same scheme in init_weights."""
    return torch.Generator().manual_seed(_parameter_seed(seed, fqn))


def _parameter_seed(seed: int, fqn: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(fqn.encode())) % 2**63


def tile_generator(seed: int, fqn: str, tile: int) -> torch.Generator:
    """The generator of tile number ``tile`` (row-major over the tile grid) of a tiled parameter."""
    return torch.Generator().manual_seed((_parameter_seed(seed, fqn) + (tile + 1) * 0x9E3779B97F4A7C15) % 2**63)


def tile_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The edge of a tile along each dimension of a parameter of ``shape``."""
    if len(shape) == 1:
        return (TILE_VECTOR,)
    return (1,) * (len(shape) - 2) + (TILE_ROWS, TILE_COLUMNS)


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
    elementwise = getattr(model, "init_is_elementwise", False) is True
    # Parameter names are the model's own: the core's activation checkpointing, compile,
    # FSDP2, TP and pipeline split all keep them, so the seed of each stays the same.
    for fqn, param in model.named_parameters():
        if elementwise and param.numel() > TILED_ABOVE:
            _fill_tiled(init_parameter, fqn, param, seed)
            continue
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


def _fill_tiled(init_parameter: Callable[[str, torch.Tensor, torch.Generator], None], fqn: str,
                param: torch.Tensor, seed: int) -> None:
    """Fill the part of ``param`` this rank holds from the tiles it touches (module docstring)."""
    shape = tuple(param.shape)
    whole = tuple(slice(0, n) for n in shape)
    block = local_block(param) if isinstance(param, DTensor) else whole
    values = tiled_values(init_parameter, fqn, shape, whole if block is None else block, seed)
    if not isinstance(param, DTensor):
        param.copy_(values)
    elif block is not None:
        param.to_local().copy_(values)
    else:  # not one block of the whole: draw it all, and let DTensor cut (src_data_rank=None: no broadcast)
        shard = distribute_tensor(values.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())


def tiled_values(init_parameter: Callable[[str, torch.Tensor, torch.Generator], None], fqn: str,
                 shape: tuple[int, ...], block: tuple[slice, ...], seed: int) -> torch.Tensor:
    """The float32 CPU values of ``block`` of tiled parameter ``fqn`` (of full ``shape``), drawing only
    the tiles that overlap it."""
    out = torch.empty([s.stop - s.start for s in block], dtype=torch.float32)
    if out.numel() == 0:
        return out
    edge = tile_shape(shape)
    grid = [-(-n // e) for n, e in zip(shape, edge)]
    for index in _tiles_overlapping(block, edge):
        start = [i * e for i, e in zip(index, edge)]
        stop = [min(s + e, n) for s, e, n in zip(start, edge, shape)]
        tile = torch.empty([b - a for a, b in zip(start, stop)], dtype=torch.float32)
        number = 0
        for i, g in zip(index, grid):  # row-major over the grid: a tile's number depends on the shape only
            number = number * g + i
        init_parameter(fqn, tile, tile_generator(seed, fqn, number))
        low = [max(a, s.start) for a, s in zip(start, block)]
        high = [min(b, s.stop) for b, s in zip(stop, block)]
        out[tuple(slice(lo - s.start, hi - s.start) for lo, hi, s in zip(low, high, block))] = \
            tile[tuple(slice(lo - a, hi - a) for lo, hi, a in zip(low, high, start))]
    return out


def _tiles_overlapping(block: tuple[slice, ...], edge: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    ranges = [range(s.start // e, (s.stop - 1) // e + 1) for s, e in zip(block, edge)]
    return itertools.product(*ranges)


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
