"""Export the full model weights as safetensors, from any parallel layout.

Every rank turns its parts' state dict into full tensors one at a time (a
DTensor's ``full_tensor()`` gathers over its own mesh, so only the ranks of one
pipeline stage take part in each gather) and drops what it does not write.

* Without pipeline parallelism every rank holds every key: rank 0 writes ``path``
  (e.g. ``model.safetensors``).
* With pipeline parallelism the ranks hold different keys: the lowest rank
  holding a key writes it, into ``<stem>-0000i-of-0000n.safetensors`` next to
  ``path``, and rank 0 writes the Hugging Face style index
  ``<stem>.safetensors.index.json`` (``weight_map``: key -> shard file).

Tensor subclasses (e.g. low-precision training weights) are copied into plain
tensors of ``dtype``, so the file holds ordinary weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

from ..errors import CheckpointError
from ..runtime.os_errors import describe_os_error, io_errno
from . import states


def _save_whole(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """save_file to a temporary name, then rename: a full disk or a signal never leaves half a file, and an
    earlier export stays whole until the new one is complete."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)

        code = io_errno(exc)
        if code is not None:
            raise OSError(code, os.strerror(code), str(path)) from exc
        raise


def weights_said(weights: Literal["raw", "ema"]) -> str:
    """How an export's report line names the weights it wrote."""
    return "the EMA weights" if weights == "ema" else "the raw weights"


def export_safetensors(model_parts: list[nn.Module], path: Path, *, dtype: torch.dtype, is_rank0: bool,
                       weights: Literal["raw", "ema"] = "raw") -> None:
    """Write the full weights to ``path`` (a collective when a process group exists); ``weights`` says
    which the parts hold (the trained ones, or their EMA swapped in), for the report line."""
    path = Path(path)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    sharded = states.model_state(states.merged_view(model_parts))
    keys = sorted(k for k, v in sharded.items() if isinstance(v, torch.Tensor))
    all_keys: list[list[str]] = [keys]
    if world > 1:
        all_keys = [[] for _ in range(world)]
        dist.all_gather_object(all_keys, keys)
    owner: dict[str, int] = {}
    for r, held in enumerate(all_keys):
        for key in held:
            owner.setdefault(key, r)
    single_file = all(held == all_keys[0] for held in all_keys)
    writers = sorted(set(owner.values()))

    mine: dict[str, torch.Tensor] = {}
    for key in keys:  # same order on every rank of a stage: the gathers line up
        full = _plain(sharded[key], dtype)
        if owner[key] == rank:
            mine[key] = full
    error: str | None = None
    try:
        if single_file:
            if rank == 0:
                path.parent.mkdir(parents=True, exist_ok=True)
                _save_whole(mine, path)
        elif rank in writers:
            path.parent.mkdir(parents=True, exist_ok=True)
            _save_whole(mine, path.parent / _shard_name(path, writers.index(rank), len(writers)))
    except OSError as exc:
        error = f"cannot write the exported weights next to {path}: {describe_os_error(exc)}"
    if world > 1:
        errors: list[str | None] = [None] * world
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        raise CheckpointError(f"{error}. Point the export at a writable folder with free space.")
    if not single_file and rank == 0:
        _write_index(path, owner, writers, dtype)
    if world > 1:
        dist.barrier()
    if is_rank0:
        print(f"[checkpoint] exported the model weights ({dtype}) to {path} ({weights_said(weights)})", flush=True)


def _plain(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    # copy_ into a fresh plain tensor unwraps subclasses and unties tied weights
    # (safetensors refuses tensors that share memory).
    out = torch.empty(tuple(full.shape), dtype=dtype, device="cpu")
    out.copy_(full.detach())
    return out


def _shard_name(path: Path, index: int, count: int) -> str:
    return f"{path.stem}-{index + 1:05d}-of-{count:05d}{path.suffix}"


def _write_index(path: Path, owner: dict[str, int], writers: list[int], dtype: torch.dtype) -> None:
    weight_map = {key: _shard_name(path, writers.index(r), len(writers)) for key, r in sorted(owner.items())}
    index = {"metadata": {"dtype": str(dtype).removeprefix("torch.")}, "weight_map": weight_map}
    (path.parent / f"{path.name}.index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
