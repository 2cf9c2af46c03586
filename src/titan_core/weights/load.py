"""``checkpoint.initial_load``: the starting weights of step 0, from a Hugging Face folder or a titan checkpoint.

The model's shape for such a run comes from ``initial_shape.py`` (while the config is
resolved); this module loads the weights:

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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..boundary.meta_model import meta_model
from ..checkpoint import collect_param_shapes
from ..checkpoint.states import full_shapes, merged_view, model_state
from ..console import progress
from ..errors import ConfigError, CoreErrorInPluginCall, PluginError
from ..hf.adapter import adapter_of, hf_key_of, row_map
from ..hf.folder import HFFolder, open_hf_folder
from ..hf.stacks import stack_folder
from ..models.ties import declared_ties
from ..runtime.torch_compat import compute_local_shape_and_global_offset
from .source import WHAT, StartingWeights, source_kind
from .titan_checkpoint import load_model_weights

if TYPE_CHECKING:
    from ..plugin.protocols import TrainSpec
    from ..plugin.spec_factories import StateDictAdapter


def _local_tensors(model_parts: list[nn.Module]) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer of this rank's parts, by name: what a checkpoint holds.

    A persistent buffer that the adapter maps (a MoE routing bias that Hugging Face stores, e.g.
    DeepSeek-V3's ``e_score_correction_bias``) is loaded like a parameter."""
    found: dict[str, torch.Tensor] = {}
    for part in model_parts:
        found.update(part.named_parameters(remove_duplicate=False))
        for module_name, module in part.named_modules(remove_duplicate=False):
            skipped: set[str] = getattr(module, "_non_persistent_buffers_set", set())
            for name, buffer in module.named_buffers(recurse=False):
                if name not in skipped:
                    found[f"{module_name}.{name}" if module_name else name] = buffer
    return found


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
def load_starting_weights(weights: StartingWeights, *, spec: TrainSpec, model_parts: list[nn.Module],
                          ties: list[tuple[str, str]], is_rank0: bool) -> HFLoadStats | None:
    """Overwrite the freshly initialised weights with those of ``weights`` (a collective when distributed).

    Returns what was read from a Hugging Face folder (None for a titan checkpoint or no source).
    """
    if weights.kind == "none" or weights.path is None:
        return None
    path = weights.path
    if weights.kind == "titan":
        step = load_model_weights(path, model_parts)
        progress(f"initial weights: the model of {path} (its step {step}); optimizer state not loaded, "
                 f"training starts at step 0", is_rank0=is_rank0)
        return None
    folder = open_hf_folder(path, what=WHAT)
    stats = load_hf_weights(folder, spec=spec, model_parts=model_parts, model_args=weights.model_args, ties=ties)
    progress(f"initial weights: {stats.tensors} tensors from {path} (step 0, no optimizer state); "
             f"{stats.summary()}", is_rank0=is_rank0)
    return stats


def load_initial_weights(source: str, *, spec: TrainSpec, model_parts: list[nn.Module], model_args: object,
                         ties: list[tuple[str, str]], is_rank0: bool) -> HFLoadStats | None:
    """:func:`load_starting_weights` of a path (a tool or test with no resolved config at hand)."""
    if not source:
        return None
    path = Path(source)
    weights = StartingWeights(source_kind(path), path, None, model_args, flavor="")
    return load_starting_weights(weights, spec=spec, model_parts=model_parts, ties=ties, is_rank0=is_rank0)


@torch.no_grad()
def load_hf_weights(folder: HFFolder, *, spec: TrainSpec, model_parts: list[nn.Module], model_args: object,
                    ties: list[tuple[str, str]], on_tensor: Callable[[int], None] | None = None,
                    what: str = WHAT) -> HFLoadStats:
    """Check every name and shape (no data read), then read each rank's own slices into its parameters.

    A collective when distributed (the shapes of every stage are gathered). A pipeline
    stage reads only the tensors of its own parts; within each tensor a rank reads only
    the rows and columns of its shard, through the adapter's row map (``from_hf_rows``),
    or the whole tensor when the adapter gives none. ``on_tensor`` is called with the
    bytes read for each tensor (a progress bar).
    """

    adapter = adapter_of(spec, purpose=f"{what} of a Hugging Face folder")
    folder = stack_folder(folder, adapter, what=what)  # per-expert tensors -> the model's stacked ones
    expected = collect_param_shapes(model_parts)  # the whole model, every stage
    plan = plan_hf_load(folder, adapter=adapter, expected=expected, model_args=model_args, ties=ties, what=what)
    params = _local_tensors(model_parts)
    mine = sorted((name for name, native in plan.items() if native in params),
                  key=lambda n: (folder.tensors[n].file, n))  # each file opened once
    whole, problem = 0, None
    with folder.reader() as reader:
        try:
            for name in mine:
                info, param = folder.tensors[name], params[plan[name]]
                before = reader.bytes_read
                rows = row_map(adapter, name, info.shape, tuple(param.shape), model_args)
                region = _local_region(param)
                if rows is None or region is None:
                    whole += 1
                    (_, value), = adapter.from_hf({name: reader.read(name)}, model_args).items()
                    _check_finite(value, name, folder.path / info.file, what=what)
                    _copy_into(param, value)
                    del value
                else:
                    local = param.to_local() if isinstance(param, DTensor) else param
                    if local.numel():
                        (r0, r1), box = region[0], region[1:]
                        part = reader.read(name, rows[r0:r1], box)
                        _check_finite(part, name, folder.path / info.file, what=what)
                        local.copy_(part)
                if on_tensor is not None:
                    on_tensor(reader.bytes_read - before)
        except ConfigError as exc:  # a damaged or non-finite slice: only this rank has seen it
            problem = str(exc)
    _raise_on_every_rank(problem)
    total = sum(math.prod(i.shape) * i.dtype.itemsize for n, i in folder.tensors.items() if n in plan)
    return HFLoadStats(tensors=len(plan), bytes_read=reader.bytes_read, bytes_total=total, read_whole=whole)


def _check_finite(tensor: torch.Tensor, name: str, file: Path, *, what: str) -> None:
    """Starting weights must be finite: a NaN would only show as a NaN loss at step 1, blamed on the run."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise ConfigError(f"{what}: tensor {name} in {file} holds NaN or inf values; weights to start from must "
                          f"be finite (the file is damaged, or was saved from a run that diverged): re-download it "
                          f"or start from an earlier checkpoint.")


def _raise_on_every_rank(problem: str | None) -> None:
    """Raise ``problem`` (one rank's, or the first of several) on every rank, so none waits for the others.

    Each rank reads only its own slices, so a damaged byte range or a NaN may be seen by one
    rank alone; without this the others would go on into the first collective of the run.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, problem)
        problem = next((p for p in gathered if p), None)
    if problem:
        raise ConfigError(problem)


def check_hf_fits(folder: HFFolder, *, spec: TrainSpec, model_args: object, what: str = WHAT) -> None:
    """:func:`plan_hf_load` against a ``meta`` model of ``model_args``: no weight memory, no collective.

    Run before a model is materialised, so a config.json whose shape the tensors do not have
    (a huge vocab_size, say) is refused naming the tensor, not by the allocator.
    """
    model = meta_model(spec, model_args)
    expected = full_shapes(model_state(merged_view([model])))
    adapter = adapter_of(spec, purpose=f"{what} of a Hugging Face folder")
    plan_hf_load(stack_folder(folder, adapter, what=what), adapter=adapter, expected=expected,
                 model_args=model_args, ties=declared_ties(model), what=what)


def plan_hf_load(folder: HFFolder, *, adapter: StateDictAdapter, expected: dict[str, tuple[int, ...]], model_args: object,
                 ties: list[tuple[str, str]], what: str = WHAT) -> dict[str, str]:
    """Hugging Face name -> native name for every tensor the model takes; ConfigError listing what does not fit.

    Reads headers only (names, shapes, dtypes), so it may run on a ``meta`` model before
    any memory is allocated for the weights: a config.json that promises a huge vocabulary
    is refused here, not by the allocator.
    """
    aliases = {alias for _, alias in ties}
    plan: dict[str, str] = {}  # HF name -> native name
    problems: list[str] = []
    for name, info in sorted(folder.tensors.items()):
        try:
            mapped = hf_key_of(adapter, name, info.shape, info.dtype, model_args, to_hf=False)
        except (KeyError, ValueError, RuntimeError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        except (PluginError, CoreErrorInPluginCall) as exc:
            if not isinstance(exc.__cause__, KeyError):
                raise
            # from_hf's KeyError (raised by the adapter, or by the core's shared renames it calls) names a
            # tensor the adapter has no place for: the folder's problem (a stray or foreign tensor), not the plugin's
            problems.append(f"{name} is not a tensor of this model ({exc.__cause__.args[0] if exc.__cause__.args else ''})")
            continue
        if mapped is None:
            continue
        native, shape = mapped
        if native not in expected:
            problems.append(f"{name} has no place in the model")
        elif tuple(expected[native]) != shape:
            problems.append(f"{name} has shape {list(info.shape)} but config.json implies "
                            f"{list(_hf_shape(adapter, native, expected[native], model_args) or expected[native])}")
        elif not info.dtype.is_floating_point:
            # An integer tensor would be cast to the weights' float type without a word: never a real weight.
            problems.append(f"{name} is stored as {str(info.dtype).removeprefix('torch.')} in {info.file}, but "
                            f"the model's weights are floating-point")
        else:
            plan[name] = native
    # A native tensor to_hf drops (a MoE routing bias: training state with no Hugging Face
    # counterpart) keeps its initial value.
    missing = sorted(k for k in set(expected) - set(plan.values()) - aliases
                     if not _no_hf_counterpart(adapter, k, expected[k], model_args))
    if missing:
        problems.append(f"{len(missing)} model tensor(s) are in no file, e.g. {missing[0]}")
    if problems:
        more = f" (and {len(problems) - 3} more problems)" if len(problems) > 3 else ""
        cause = "The folder is damaged or its config.json belongs to another checkpoint."
        if missing and len(problems) == 1:  # nothing else is wrong: the model may have more than config.json says
            cause = ("The folder lacks them (damaged, or saved without part of the model), or a model setting given "
                     "beside its config.json adds modules it does not hold (such as a prediction block): leave that "
                     "setting out, or start those modules from scratch in a run without this folder.")
        raise ConfigError(f"{what}: {folder.path} does not fit the model its config.json describes: "
                          f"{'; '.join(problems[:3])}{more}. {cause}")
    return plan


def _local_region(param: torch.Tensor) -> tuple[tuple[int, int], ...] | None:
    """``[start, stop)`` per dim of the part of the full tensor this rank holds; None if not one box.

    A DTensor shard is the box at its global offset (the layout DCP's checkpoints assume
    too); None (read whole, shard with distribute_tensor) if the computed box does not
    match the local tensor's shape.
    """
    if not isinstance(param, DTensor):
        return tuple((0, n) for n in param.shape)
    # What DCP itself uses to place shards (private to torch); a torch without it reads whole.
    box = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if box is None:
        return None
    shape, offset = box
    if tuple(shape) != tuple(param.to_local().shape) or len(offset) != len(shape):
        return None
    return tuple((o, o + n) for o, n in zip(offset, shape))


def _no_hf_counterpart(adapter: StateDictAdapter, native: str, shape: tuple[int, ...], model_args: object) -> bool:
    try:
        return hf_key_of(adapter, native, tuple(shape), torch.float32, model_args, to_hf=True) is None
    except (KeyError, ValueError, RuntimeError):
        return False


def _hf_shape(adapter: StateDictAdapter, native: str, shape: tuple[int, ...], model_args: object) -> tuple[int, ...] | None:
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
