"""Read only the model weights of a titan checkpoint (for initial_load and titan-convert), or its EMA of
them (``titan-convert to-hf --weights ema``).

The same checks as a resume (complete folder, identity file, every file's checksum,
shapes) but nothing else is loaded: no optimizer, schedule, data position or RNG.
DCP reshards, so the checkpoint may come from any layout and land in any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from ..checkpoint import integrity, layout, states
from ..checkpoint.identity import read_record
from ..checkpoint.reading import open_checked_record
from ..checkpoint.stateful import EMA
from ..checkpoint.storage import CheckedLoadPlanner, IndexedReader
from ..checkpoint.tensor_index import read_index
from ..errors import CheckpointError, ConfigError
from ..runtime.folder_kinds import is_titan_checkpoint


def newest_checkpoint(folder: Path) -> tuple[Path, str] | None:
    """For a run folder (or its checkpoints/ folder): its newest ``step-N`` checkpoint and which of the
    two ``folder`` is ("a run folder" / "a folder of checkpoints"); None when it is neither."""
    folder = Path(folder)
    for holder, kind in ((folder / "checkpoints", "a run folder"), (folder, "a folder of checkpoints")):
        steps = sorted(p for p in holder.glob("step-*") if is_titan_checkpoint(p)) if holder.is_dir() else []
        if steps:
            return steps[-1], kind
    return None


def run_folder_hint(folder: Path) -> str:
    """For a titan run folder (or its checkpoints/ folder) given where a checkpoint belongs: which to name.

    "" when ``folder`` is neither; otherwise a sentence naming the newest ``step-N`` in it.
    """
    found = newest_checkpoint(folder)
    if found is None:
        return ""
    return f" {folder} is {found[1]}: name one of its checkpoints, e.g. the newest, {found[0]}."


def saved_param_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The full shapes a checkpoint's identity file records (no tensor data read)."""
    layout.require_complete(Path(path))
    return read_record(Path(path)).identity.param_shapes


def _misfit(path: Path, *, saved: dict[str, tuple[int, ...]], current: dict[str, tuple[int, ...]]) -> str | None:
    """Why the checkpoint's tensors do not fit the model's, in a sentence; None when they fit."""
    absent = [k for k in sorted(current) if k not in saved]
    wrong = [f"{k}: checkpoint {list(saved[k])}, model {list(v)}" for k, v in sorted(current.items())
             if k in saved and saved[k] != v]
    if absent and not wrong:
        # Only modules the saving run did not have (a model setting that adds a block, such as a multi-token
        # prediction layer): "choose the flavor" would not help, the setting that added them would.
        return (f"checkpoint {path} holds no weights for {len(absent)} tensors this model has (e.g. {absent[0]}): "
                f"the model has modules the run that saved it had not. Leave out the model setting that adds them "
                f"(give the model settings that run had), or train those modules from scratch in a new run")
    if absent or wrong:
        first = wrong[0] if wrong else f"{absent[0]}: not in the checkpoint"
        return (f"checkpoint {path} does not fit this model ({len(absent) + len(wrong)} tensors differ, e.g. "
                f"{first}); give the flavor and model settings it was trained with")
    return None


def load_model_weights(path: Path, model_parts: list[nn.Module], *, weights: Literal["raw", "ema"] = "raw") -> int:
    """Load the checkpoint's model tensors into ``model_parts`` (a collective); returns the step it holds.

    ``weights="ema"``: then the parameters take the checkpoint's EMA of them (buffers stay the model's);
    a checkpoint without one is a ConfigError naming the fix."""
    path = Path(path)
    record = open_checked_record(path)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    error = integrity.verify_share(path, record.files, rank=rank, world=world)
    if error is None:
        error = _misfit(path, saved=record.identity.param_shapes, current=states.collect_param_shapes(model_parts))
    if distributed:
        errors: list[str | None] = [None] * world
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        raise CheckpointError(error)
    # Parsed only now: every byte of the index was verified against the manifest above.
    index = read_index(path, record.files)
    if weights == "ema" and not any(key.startswith(f"{EMA}.") for key in index.tensors):
        raise ConfigError(f"checkpoint {path} holds no EMA of the weights: the run that saved it had no [ema] "
                          f"section (ema.decay unset). Use its raw weights (--weights raw), or train with "
                          f"--ema.decay=... to keep an EMA in the checkpoints.")
    view = states.merged_view(model_parts)
    state = {"model": states.model_state(view)}
    try:
        dcp.load(state, storage_reader=IndexedReader(path, index), planner=CheckedLoadPlanner())
    except (Exception, CheckpointException) as exc:
        raise CheckpointError(f"cannot read the model weights of {path}: {exc}") from None
    states.load_model_state(view, state["model"])
    if weights == "ema":
        # Loaded in place into the parameters (local shards under FSDP2/TP), after the model's own tensors.
        averages = {EMA: {name: param.detach() for name, param in states.named_parameters(model_parts)}}
        try:
            dcp.load(averages, storage_reader=IndexedReader(path, index), planner=CheckedLoadPlanner())
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"cannot read the EMA weights of {path}: {exc}") from None
    return record.step
