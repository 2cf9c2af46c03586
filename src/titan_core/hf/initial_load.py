"""``checkpoint.initial_load``: the starting weights of step 0, from a Hugging Face folder or a titan checkpoint.

Two calls from the Trainer:

* :func:`initial_model_args` (building the model): with a Hugging Face folder the shape
  comes from its ``config.json`` through the spec's adapter; a spec-section value that
  contradicts the file is an error listing each field (the adapter's ``runtime_fields``,
  such as the RoPE table length, may differ); the shape taken is printed.
* :func:`load_initial_weights` (after resume found nothing of the run's own): every rank
  reads, one tensor at a time, only the tensors its model parts hold, and of each only
  the rows and columns of its own shard (the adapter's ``from_hf_rows`` says which Hugging
  Face rows a native row comes from), so a rank reads about its shard, not the model.
  With an adapter that gives no row map, a rank reads each of its tensors whole and
  keeps its shard (peak: shard plus one full tensor). No optimizer state is loaded.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..errors import ConfigError
from ..init import clean_fqn
from ..metrics import progress
from .adapter import adapter_of, hf_key_of, row_map
from .model_args import HF_CONFIG_IN_CHECKPOINT
from .folder import HFFolder, is_hf_folder, open_hf_folder

WHAT = "checkpoint.initial_load"


def _source_kind(path: Path) -> str:
    from ..checkpoint.weights import is_titan_checkpoint

    if is_hf_folder(path):
        return "hf"
    if is_titan_checkpoint(path):
        return "titan"
    if not path.exists():
        raise ConfigError(f"{WHAT}: {path} does not exist; give a Hugging Face model folder or a titan checkpoint "
                          f"folder (e.g. runs/x/checkpoints/step-000100).")
    # open_hf_folder names what a would-be HF folder lacks (no config.json, no safetensors ...).
    open_hf_folder(path, what=WHAT)
    raise AssertionError("unreachable")  # pragma: no cover


def shape_file(config: Any) -> Path | None:
    """The ``config.json`` this run's model shape comes from; None when it is the flavor's.

    An HF folder's ``config.json``, or the ``hf_config.json`` that ``titan-convert from-hf``
    leaves in a titan checkpoint. A source that is neither (or does not exist) gives None
    here; loading it is what reports it.
    """
    from ..checkpoint.weights import is_titan_checkpoint

    source = config.checkpoint.initial_load
    if not source:
        return None
    path = Path(source)
    if is_hf_folder(path):
        return path / "config.json"
    carried = path / HF_CONFIG_IN_CHECKPOINT
    return carried if carried.is_file() and is_titan_checkpoint(path) else None


def shape_source(config: Any) -> str:
    """``flavor NAME``, or ``shape from FILE`` when an ``initial_load`` gives the shape (for messages)."""
    file = shape_file(config)
    return f"flavor {config.model.flavor}" if file is None else f"shape from {file}"


def model_label(spec: Any, config: Any) -> str:
    """How the run log names its model: ``spec/flavor``, or the spec and the config.json its shape came from."""
    file = shape_file(config)
    return f"{spec.name}/{config.model.flavor}" if file is None else f"{spec.name} (shape from {file})"


def config_json_model_args(spec: Any, config: Any) -> Any | None:
    """The model args from the ``initial_load``'s config.json (None: the flavor gives them).

    The spec section's runtime fields apply on top; any other field it sets must agree
    with the file, or a ConfigError lists each one. Config validation, ``--dry-run`` and
    the real run all take the shape from here.
    """
    file = shape_file(config)
    if file is None:
        return None
    source = config.checkpoint.initial_load
    # A checkpoint made by titan-convert from-hf carries its shape; an HF folder's is read with its tensor headers.
    hf_dict = _read_json(file) if file.name == HF_CONFIG_IN_CHECKPOINT else open_hf_folder(source, what=WHAT).config
    adapter = adapter_of(spec, purpose=f"{WHAT} of a Hugging Face folder")
    args = adapter.model_args_from_hf(hf_dict)
    section = getattr(config, spec.name, None)
    chosen = {k: v for k, v in section.model_dump().items() if v is not None} if section is not None else {}
    conflicts = [f"{spec.name}.{k}={v!r} (config.json: {getattr(args, k)!r})"
                 for k, v in chosen.items() if k not in adapter.runtime_fields and getattr(args, k, v) != v]
    if conflicts:
        raise ConfigError(
            f"{WHAT}={source}: the model shape comes from its config.json, and these settings contradict it: "
            f"{'; '.join(conflicts)}. Remove them (or edit config.json)."
        )
    return dataclasses.replace(args, **{k: v for k, v in chosen.items() if k in adapter.runtime_fields})


def initial_model_args(spec: Any, config: Any, *, tokenizer: Any, world_size: int, is_rank0: bool) -> Any:
    """The model args of this run: from config.json for an HF ``initial_load``, else the flavor's.

    Also checks, before anything is trained, that an ``hf`` export will be possible. The
    real run and ``--dry-run`` both call it, so both take (and refuse) the same shape.
    """
    vocab_size = tokenizer.vocab_size
    if config.checkpoint.export_at_end and config.checkpoint.export_format == "hf":
        from .export import check_hf_export

        check_hf_export(spec, tokenizer)  # now, not after training
    source = config.checkpoint.initial_load
    if source:
        _source_kind(Path(source))  # a source that is no model folder fails now, not after set-up
    args = config_json_model_args(spec, config)
    if args is None:
        return spec.model_args(config.model.flavor, getattr(config, spec.name, None), vocab_size=vocab_size)
    model_vocab = getattr(args, "vocab_size", None)
    if isinstance(model_vocab, int) and vocab_size > model_vocab:
        raise ConfigError(
            f"{WHAT}={source}: the tokenizer has {vocab_size} tokens but the model's vocabulary (config.json "
            f"vocab_size) has {model_vocab}; use the tokenizer the model was trained with (--data.tokenizer)."
        )
    if spec.validate_fn is not None:
        spec.validate_fn(args, parallelism=config.parallelism, training=config.training, world_size=world_size)
    shape = ", ".join(f"{f.name}={getattr(args, f.name)}" for f in dataclasses.fields(args))
    progress(f"model shape from {shape_file(config)} (model.flavor is ignored): {shape}", is_rank0=is_rank0)
    return args


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{WHAT}: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{WHAT}: {path} is not a JSON object")
    return data


def _local_params(model_parts: list[nn.Module]) -> dict[str, nn.Parameter]:
    return {clean_fqn(name): p for part in model_parts for name, p in part.named_parameters(remove_duplicate=False)}


@dataclasses.dataclass(frozen=True)
class HFLoadStats:
    """What one rank's :func:`load_hf_weights` did."""

    tensors: int  # tensors of the folder that the model takes (all ranks together)
    bytes_read: int  # tensor bytes this rank read from the files
    bytes_total: int  # tensor bytes of those tensors in the files
    read_whole: int  # tensors this rank read whole (its adapter has no row map for them)

    def summary(self) -> str:
        whole = f", {self.read_whole} tensors read whole" if self.read_whole else ""
        return (f"this rank read {self.bytes_read / 2**20:.2f} of {self.bytes_total / 2**20:.2f} MiB: "
                f"its own slices{whole}")


@torch.no_grad()
def load_initial_weights(source: str, *, spec: Any, model_parts: list[nn.Module], model_args: Any,
                         ties: list[tuple[str, str]], is_rank0: bool) -> HFLoadStats | None:
    """Overwrite the freshly initialised weights with ``source``'s (a collective when distributed).

    Returns what was read from a Hugging Face folder (None for a titan checkpoint or no source).
    """
    if not source:
        return None
    path = Path(source)
    if _source_kind(path) == "titan":
        from ..checkpoint.weights import load_model_weights

        step = load_model_weights(path, model_parts)
        progress(f"initial weights: the model of {path} (its step {step}); optimizer state not loaded, "
                 f"training starts at step 0", is_rank0=is_rank0)
        return None
    folder = open_hf_folder(path, what=WHAT)
    stats = load_hf_weights(folder, spec=spec, model_parts=model_parts, model_args=model_args, ties=ties)
    progress(f"initial weights: {stats.tensors} tensors from {path} (step 0, no optimizer state); "
             f"{stats.summary()}", is_rank0=is_rank0)
    return stats


@torch.no_grad()
def load_hf_weights(folder: HFFolder, *, spec: Any, model_parts: list[nn.Module], model_args: Any,
                    ties: list[tuple[str, str]], on_tensor: Callable[[int], None] | None = None,
                    what: str = WHAT) -> HFLoadStats:
    """Check every name and shape (no data read), then read each rank's own slices into its parameters.

    A collective when distributed (the shapes of every stage are gathered). A pipeline
    stage reads only the tensors of its own parts; within each tensor a rank reads only
    the rows and columns of its shard, through the adapter's row map (``from_hf_rows``),
    or the whole tensor when the adapter gives none. ``on_tensor`` is called with the
    bytes read for each tensor (a progress bar).
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
    mine = sorted((name for name, native in plan.items() if native in params),
                  key=lambda n: (folder.tensors[n].file, n))  # each file opened once
    whole = 0
    with folder.reader() as reader:
        for name in mine:
            info, param = folder.tensors[name], params[plan[name]]
            before = reader.bytes_read
            rows = row_map(adapter, name, info.shape, tuple(param.shape), model_args)
            region = _local_region(param)
            if rows is None or region is None:
                whole += 1
                (_, value), = adapter.from_hf({name: reader.read(name)}, model_args).items()
                _copy_into(param, value)
                del value
            else:
                local = param.to_local() if isinstance(param, DTensor) else param
                if local.numel():
                    (r0, r1), box = region[0], region[1:]
                    local.copy_(reader.read(name, rows[r0:r1], box))
            if on_tensor is not None:
                on_tensor(reader.bytes_read - before)
    total = sum(math.prod(i.shape) * i.dtype.itemsize for n, i in folder.tensors.items() if n in plan)
    return HFLoadStats(tensors=len(plan), bytes_read=reader.bytes_read, bytes_total=total, read_whole=whole)


def _local_region(param: torch.Tensor) -> tuple[tuple[int, int], ...] | None:
    """``[start, stop)`` per dim of the part of the full tensor this rank holds; None if not one box.

    A DTensor shard is the box at its global offset (the layout DCP's checkpoints assume
    too); None (read whole, shard with distribute_tensor) if the computed box does not
    match the local tensor's shape.
    """
    if not isinstance(param, DTensor):
        return tuple((0, n) for n in param.shape)
    try:  # private, but what DCP itself uses to place shards; a torch without it reads whole
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:  # pragma: no cover
        return None

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if tuple(shape) != tuple(param.to_local().shape) or len(offset) != len(shape):
        return None
    return tuple((o, o + n) for o, n in zip(offset, shape))


def _hf_shape(adapter: Any, native: str, shape: tuple[int, ...], model_args: Any) -> tuple[int, ...] | None:
    try:
        mapped = hf_key_of(adapter, native, tuple(shape), torch.float32, model_args, to_hf=True)
    except (KeyError, ValueError, RuntimeError):
        return None
    return mapped[1] if mapped else None


def _copy_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the full tensor ``full`` into ``param`` (plain or DTensor): the whole-tensor path."""
    if isinstance(param, DTensor):
        full = full.to(device=param.device, dtype=param.dtype)
        # Every rank holding the parameter read the same full tensor: no broadcast needed.
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)
