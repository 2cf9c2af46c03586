"""``--checkpoint.export_format=hf``: the trained model as a Hugging Face folder, from any layout.

Writes ``config.json`` (the spec adapter's ``hf_config`` plus token ids and dtype),
``generation_config.json``, the weights in Hugging Face names (``model.safetensors``, or
``model-0000i-of-0000n.safetensors`` shards of at most ``shard_gb`` each plus
``model.safetensors.index.json``), and the tokenizer (``tokenizer.json`` derived from the
tiktoken ranks, ``original/tokenizer.model``), so ``AutoModelForCausalLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load it with no code.

Every rank gathers full tensors one at a time (a DTensor's ``full_tensor()`` gathers over
its own mesh); the lowest rank holding a tensor keeps it and writes it. The folder is
written next to its final place and published whole at the end (``folder_publish``): a failed
or interrupted export never leaves a half-written ``hf/`` behind, and files a user added to an
earlier export (evaluation results, notes) are kept, never deleted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

from ..checkpoint import states
from ..checkpoint.safetensors_export import weights_said
from ..errors import CheckpointError, ConfigError
from ..runtime.folder_publish import fresh_partial, partial_of, publish
from ..runtime.os_errors import describe_os_error, io_errno
from .adapter import adapter_of
from .folder import INDEX, SINGLE
from .stacks import unstack
from .tokenizer_json import write_hf_tokenizer

if TYPE_CHECKING:
    from ..data.tokenizer import TiktokenTokenizer
    from ..plugin.protocols import Tokenizer, TrainSpec


def check_hf_export(spec: TrainSpec, tokenizer: Tokenizer) -> None:
    """Fail before training (not after it) when an hf export cannot be written."""
    adapter_of(spec, purpose="checkpoint.export_format=hf")
    if not hasattr(tokenizer, "mergeable_ranks"):
        raise ConfigError("checkpoint.export_format=hf writes the tokenizer from tiktoken ranks, but this run's "
                          f"tokenizer ({type(tokenizer).__name__}) has none; use a tokenizer.model (tiktoken) "
                          f"tokenizer or export_format=native.")


def hf_config_json(spec: TrainSpec, model_args: object, tokenizer: Tokenizer, dtype: torch.dtype) -> dict[str, Any]:
    config = dict(adapter_of(spec, purpose="an hf config").hf_config(model_args))
    config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
                  torch_dtype=str(dtype).removeprefix("torch."))
    return config


def _full(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    out = torch.empty(tuple(full.shape), dtype=dtype, device="cpu")  # plain, unshared, CPU
    out.copy_(full.detach())
    return out


def plan_shards(sizes: list[tuple[int, str, int]], limit_bytes: int) -> list[list[str]]:
    """Group (writer rank, name, bytes) into files: in order, a new file when a rank changes or the limit is passed."""
    shards: list[list[str]] = []
    current: list[str] = []
    current_rank, current_bytes = None, 0
    for rank, name, size in sizes:
        if current and (rank != current_rank or current_bytes + size > limit_bytes):
            shards.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_rank, current_bytes = rank, current_bytes + size
    if current:
        shards.append(current)
    return shards


def shard_file_names(count: int) -> list[str]:
    return [SINGLE] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def export_hf(model_parts: list[nn.Module], out_dir: Path, *, spec: TrainSpec, model_args: object, tokenizer: Tokenizer,
              dtype: torch.dtype, shard_gb: float, is_rank0: bool,
              on_tensor: Callable[[int], None] | None = None,
              failure_advice: str = "Point job.run_dir at a writable folder with free space.",
              weights: Literal["raw", "ema"] = "raw") -> None:
    """Write ``out_dir`` as a Hugging Face folder (a collective when a process group exists).

    ``on_tensor`` is called with each tensor's byte size once it is gathered (a progress bar);
    ``failure_advice`` ends the error of a failed write (a tool names its own flag, not job.run_dir);
    ``weights`` says which weights the parts hold (the trained ones, or their EMA swapped in), for the
    line that reports the export.
    """
    out_dir = Path(out_dir)
    adapter = adapter_of(spec, purpose="checkpoint.export_format=hf")
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    def gather(obj: object) -> list[Any]:
        if not distributed:
            return [obj]
        out: list[Any] = [None] * world
        dist.all_gather_object(out, obj)
        return out

    sharded = states.model_state(states.merged_view(model_parts))
    keys = sorted(k for k, v in sharded.items() if isinstance(v, torch.Tensor))
    owner: dict[str, int] = {}
    for r, held in enumerate(gather(keys)):
        for key in held:
            owner.setdefault(key, r)
    mine: dict[str, torch.Tensor] = {}
    for key in keys:  # same order on every rank of a stage: the gathers line up
        full = _full(sharded[key], dtype)
        if owner[key] == rank:
            hf = unstack(adapter, adapter.to_hf({key: full}, model_args))  # stacked experts: one tensor each
            mine.update((name, t.contiguous()) for name, t in hf.items())
        if on_tensor is not None:
            on_tensor(full.numel() * full.element_size())
        del full
    sizes = sorted((r, name, size) for r, share in enumerate(gather({n: t.numel() * t.element_size()
                                                                     for n, t in mine.items()}))
                   for name, size in share.items())
    shards = plan_shards(sizes, int(shard_gb * 1e9))
    files = shard_file_names(len(shards))

    tmp = partial_of(out_dir)
    error: str | None = None
    if rank == 0:
        try:
            fresh_partial(out_dir)
        except OSError as exc:
            error = f"cannot create {tmp}: {exc}"
        except ConfigError as exc:
            error = str(exc)
    error = next((e for e in gather(error) if e), None)
    if error is None:
        try:
            for names, file in zip(shards, files):
                if names[0] in mine:
                    save_file({n: mine[n] for n in names}, str(tmp / file), metadata={"format": "pt"})
        except Exception as exc:  # safetensors reports a full disk as its own exception type

            code = io_errno(exc)
            if code is None:
                raise
            error = (f"cannot write the Hugging Face export into {tmp}: "
                     f"{describe_os_error(OSError(code, os.strerror(code), str(tmp / file)))}")
        error = next((e for e in gather(error) if e), None)
    if error is None and rank == 0:
        try:
            _write_metadata(tmp, spec=spec, model_args=model_args, tokenizer=tokenizer, dtype=dtype,
                            shards=shards, files=files, total=sum(s for _, _, s in sizes))
            publish(tmp, out_dir)  # files a user put in out_dir stay; nothing is deleted that we did not write
        except ConfigError as exc:
            error = str(exc)
        except OSError as exc:
            error = f"cannot finish the Hugging Face export in {out_dir}: {exc}"
    error = next((e for e in gather(error) if e), None)
    if error:
        raise CheckpointError(f"{error.rstrip('.')}. {failure_advice}")
    if is_rank0:
        print(f"[checkpoint] exported a Hugging Face folder ({str(dtype).removeprefix('torch.')}, {len(files)} safetensors file"
              f"{'s' if len(files) > 1 else ''}) to {out_dir} ({weights_said(weights)})", flush=True)


def _write_metadata(folder: Path, *, spec: TrainSpec, model_args: object, tokenizer: Tokenizer, dtype: torch.dtype,
                    shards: list[list[str]], files: list[str], total: int) -> None:
    config = hf_config_json(spec, model_args, tokenizer, dtype)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    if len(files) > 1:
        weight_map = {name: file for names, file in zip(shards, files) for name in names}
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")
    write_hf_tokenizer(cast("TiktokenTokenizer", tokenizer), folder)  # check_hf_export refused any other kind
