"""State dicts of what a checkpoint holds: model parts, optimizer, RNG streams.

Model and optimizer go through ``torch.distributed.checkpoint.state_dict`` so
FSDP2 / TP DTensors are saved as the shards they are and DCP reshards on load.
Keys are canonical fqns (compile and activation-checkpoint wrappers removed),
which is what makes a checkpoint loadable under another layout.
"""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..optim.param_groups import clean_name
from ..runtime.torch_compat import tree_map

# Flattened keys ("state.<fqn>.exp_avg", "param_groups.<fqn>.lr") do not depend on
# parameter order, so the optimizer state reshards across pipeline layouts too.
_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def merged_view(model_parts: list[nn.Module]) -> nn.Module:
    """One module whose state-dict keys are the parts' own fqns.

    With pipeline parallelism a rank holds several parts (stages) of one model
    with disjoint fqns, and a single optimizer spans them all; DCP's state-dict
    helpers need one module that owns every parameter the optimizer holds. The
    view is a tree of plain containers wherever parts share a path (e.g. each
    part's ``layers``) and the parts' own submodules below, so FSDP2's per-module
    state-dict hooks still fire.
    """
    if len(model_parts) == 1:
        return model_parts[0]
    return _merge(model_parts, path="")


def _merge(modules: list[nn.Module], *, path: str) -> nn.Module:
    node = nn.Module()
    children: dict[str, list[nn.Module]] = {}
    for module in modules:
        for name, param in module.named_parameters(recurse=False):
            if name in node._parameters:
                raise ValueError(f"model parts both own the parameter {path}{name}; pipeline parts must be disjoint")
            node.register_parameter(name, param)
        for name, buf in module.named_buffers(recurse=False):
            node.register_buffer(name, buf, persistent=name not in module._non_persistent_buffers_set)
        for name, child in module.named_children():
            group = children.setdefault(name, [])
            if all(child is not seen for seen in group):
                group.append(child)
    for name, group in children.items():
        node.add_module(name, group[0] if len(group) == 1 else _merge(group, path=f"{path}{name}."))
    return node


def named_parameters(model_parts: list[nn.Module]) -> list[tuple[str, nn.Parameter]]:
    """Every parameter of the parts once (a tied weight under its first name), by its canonical fqn
    (compile and activation-checkpoint wrappers removed): the same names under any layout."""
    return [(clean_name(name), param) for name, param in merged_view(model_parts).named_parameters()]


def laid_out_like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's share of a state kept per parameter) as a DTensor with ``param``'s mesh,
    placements and global shape when ``param`` is a DTensor, so DCP saves each rank's shard; else as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                                  stride=param.stride())
    return local


def optimizers_of(optimizer: torch.optim.Optimizer) -> tuple[torch.optim.Optimizer, ...]:
    """The real optimizers: a container's ``optimizers`` list (one per part), else itself."""
    inner = getattr(optimizer, "optimizers", None)
    if isinstance(inner, (list, tuple)) and inner and all(isinstance(o, torch.optim.Optimizer) for o in inner):
        return tuple(inner)
    return (optimizer,)


def plain_tensor(value: object) -> object:
    """A converter's weight-wrapper tensor subclass (one inner tensor of the same shape and
    dtype, e.g. MX training weights) as that inner tensor; anything else unchanged.

    DCP pickles a subclass with its class, and loading refuses classes outside torch's
    allow-list (``weights_only``), so a checkpoint must hold the plain data. The inner
    tensor shares the wrapper's storage, so loading into it restores the wrapper too.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(value, torch.Tensor) or isinstance(value, DTensor) or type(value) in (torch.Tensor, nn.Parameter):
        return value
    flatten = getattr(value, "__tensor_flatten__", None)
    if flatten is None:
        return value
    names, _ = flatten()
    if len(names) != 1:
        return value
    inner = getattr(value, names[0])
    return inner if inner.shape == value.shape and inner.dtype == value.dtype else value


def _plain(state: dict[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = tree_map(plain_tensor, state)
    return plain


def model_state(view: nn.Module) -> dict[str, Any]:
    return _plain(get_model_state_dict(view))


def load_model_state(view: nn.Module, state: dict[str, Any]) -> None:
    set_model_state_dict(view, state)


def optimizer_state(view: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    # Note: before the first step DCP initialises the optimizer state with one
    # zero-lr step so that there are tensors to load into.
    return _plain(get_optimizer_state_dict(view, optimizers_of(optimizer), options=_OPTIM_OPTIONS))


def load_optimizer_state(view: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    set_optimizer_state_dict(view, optimizers_of(optimizer), state, options=_OPTIM_OPTIONS)


def full_shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Full shapes of a model state dict (a DTensor's ``shape`` is its global shape)."""
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def collect_param_shapes(model_parts: list[nn.Module]) -> dict[str, tuple[int, ...]]:
    """Full shapes of every parameter and persistent buffer, over all ranks' parts.

    A collective when a process group exists (every rank must call it): pipeline
    ranks hold different parts, and the identity must describe the whole model.
    """
    local = full_shapes(model_state(merged_view(model_parts)))
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    gathered: list[dict[str, tuple[int, ...]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    merged: dict[str, tuple[int, ...]] = {}
    for shapes in gathered:
        merged.update(shapes or {})
    return merged


# ---- RNG streams, as tensors (DCP stores tensors without pickling) ---------------


def rng_state() -> dict[str, torch.Tensor]:
    """This process's RNG streams: torch CPU, CUDA (current device), Python, numpy."""
    version, internal, gauss = random.getstate()
    state = {
        "torch_cpu": torch.get_rng_state(),
        "python": torch.tensor([version, *internal], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        if kind == "MT19937":
            state["numpy"] = torch.tensor([pos, has_gauss, *keys.tolist()], dtype=torch.int64)
            state["numpy_gauss"] = torch.tensor([cached], dtype=torch.float64)
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    """Restore streams saved by ``rng_state``; streams this process lacks are skipped."""
    torch.set_rng_state(state["torch_cpu"].to(torch.uint8))
    values = state["python"].tolist()
    has_gauss, gauss = state["python_gauss"].tolist()
    random.setstate((int(values[0]), tuple(int(v) for v in values[1:]), gauss if has_gauss else None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].to(torch.uint8))
    np = _numpy()
    if np is not None and "numpy" in state:
        pos, has_np_gauss, *keys = state["numpy"].tolist()
        np.random.set_state(
            ("MT19937", np.array(keys, dtype=np.uint32), int(pos), int(has_np_gauss), float(state["numpy_gauss"][0]))
        )


def _numpy() -> Any:
    try:
        import numpy  # noqa: PLC0415  (optional dependency)
    except ImportError:
        return None
    return numpy
