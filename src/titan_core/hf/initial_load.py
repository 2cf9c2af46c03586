"""``checkpoint.initial_load``: the starting weights of step 0, from a Hugging Face folder or a titan checkpoint.

The model's shape for such a run comes from ``initial_shape.py``; this module loads the weights:

* :func:`load_initial_weights` (after resume found nothing of the run's own): every rank
  reads, one tensor at a time, only the tensors its model parts hold, and copies its own
  shard out of each, so a rank's peak is its shard plus one full tensor. No optimizer
  state is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..errors import ConfigError
from ..metrics import progress
from .adapter import adapter_of, hf_key_of
from .folder import HFFolder, open_hf_folder
from .initial_shape import WHAT, source_kind


def _local_params(model_parts: list[nn.Module]) -> dict[str, nn.Parameter]:
    return {name: p for part in model_parts for name, p in part.named_parameters(remove_duplicate=False)}


@torch.no_grad()
def load_initial_weights(source: str, *, spec: Any, model_parts: list[nn.Module], model_args: Any,
                         ties: list[tuple[str, str]], is_rank0: bool) -> None:
    """Overwrite the freshly initialised weights with ``source``'s (a collective when distributed)."""
    if not source:
        return
    path = Path(source)
    if source_kind(path) == "titan":
        from ..checkpoint.weights import load_model_weights

        step = load_model_weights(path, model_parts)
        progress(f"initial weights: the model of {path} (its step {step}); optimizer state not loaded, "
                 f"training starts at step 0", is_rank0=is_rank0)
        return
    folder = open_hf_folder(path, what=WHAT)
    count = load_hf_weights(folder, spec=spec, model_parts=model_parts, model_args=model_args, ties=ties)
    progress(f"initial weights: {count} tensors from {path} (step 0, no optimizer state)", is_rank0=is_rank0)


@torch.no_grad()
def load_hf_weights(folder: HFFolder, *, spec: Any, model_parts: list[nn.Module], model_args: Any,
                    ties: list[tuple[str, str]], on_tensor: Callable[[int], None] | None = None,
                    what: str = WHAT) -> int:
    """Check every name and shape (no data read), then copy each rank's shards in; returns the tensor count.

    A collective when distributed (the shapes of every stage are gathered). ``on_tensor``
    is called with each tensor's byte size after it is copied (a progress bar).
    """
    from ..checkpoint import collect_param_shapes

    path = folder.path
    adapter = adapter_of(spec, purpose=f"{what} of a Hugging Face folder")
    expected = collect_param_shapes(model_parts)  # the whole model, every stage
    aliases = {alias for _, alias in ties}
    plan: dict[str, str] = {}  # HF name -> native name
    problems: list[str] = []
    for name, info in sorted(folder.tensors.items()):
        try:
            mapped = hf_key_of(adapter, name, info.shape, info.dtype, model_args, to_hf=False)
        except (KeyError, ValueError, RuntimeError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        if mapped is None:
            continue
        native, shape = mapped
        if native not in expected:
            problems.append(f"{name} has no place in the model")
        elif tuple(expected[native]) != shape:
            problems.append(f"{name} has shape {list(info.shape)} but config.json implies "
                            f"{list(_hf_shape(adapter, native, expected[native], model_args) or expected[native])}")
        else:
            plan[name] = native
    missing = sorted(set(expected) - set(plan.values()) - aliases)
    if missing:
        problems.append(f"{len(missing)} model tensor(s) are in no file, e.g. {missing[0]}")
    if problems:
        more = f" (and {len(problems) - 3} more problems)" if len(problems) > 3 else ""
        raise ConfigError(f"{what}: {path} does not fit the model its config.json describes: "
                          f"{'; '.join(problems[:3])}{more}. The folder is damaged or its config.json belongs to "
                          f"another checkpoint.")
    params = _local_params(model_parts)
    mine = [name for name, native in plan.items() if native in params]
    with folder.read(mine) as reader:
        for name, tensor in reader:
            (native, value), = adapter.from_hf({name: tensor}, model_args).items()
            _copy_into(params[native], value)
            if on_tensor is not None:
                on_tensor(value.numel() * value.element_size())
            del tensor, value
    return len(plan)


def _hf_shape(adapter: Any, native: str, shape: tuple[int, ...], model_args: Any) -> tuple[int, ...] | None:
    try:
        mapped = hf_key_of(adapter, native, tuple(shape), torch.float32, model_args, to_hf=True)
    except (KeyError, ValueError, RuntimeError):
        return None
    return mapped[1] if mapped else None


def _copy_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the full tensor ``full`` into ``param`` (plain or DTensor)."""
    if isinstance(param, DTensor):
        full = full.to(device=param.device, dtype=param.dtype)
        # Every rank holding the parameter read the same full tensor: no broadcast needed.
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)
