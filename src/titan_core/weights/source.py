"""What a ``checkpoint.initial_load`` path is, and the names of the files that record it.

The bottom of the starting-weights package: the loader, the shape reader and the
checkpoint model-args reader all name these, so none of them imports another for them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError
from ..hf.folder import open_hf_folder
from ..runtime.folder_kinds import is_hf_folder, is_titan_checkpoint
from .titan_checkpoint import run_folder_hint

WHAT = "checkpoint.initial_load"
# The config.json a run's shape came from, as it was when the run started (in the run folder).
RECORDED = "initial_load_config.json"

SourceKind = Literal["none", "hf", "titan"]


def source_kind(path: Path) -> SourceKind:
    if is_hf_folder(path):
        return "hf"
    if is_titan_checkpoint(path):
        return "titan"
    if not path.exists():
        raise ConfigError(f"{WHAT}: {path} does not exist; give a Hugging Face model folder or a titan checkpoint "
                          f"folder (e.g. runs/x/checkpoints/step-000100).")
    hint = run_folder_hint(path)
    if hint:  # a run folder where one of its checkpoints belongs
        raise ConfigError(f"{WHAT}: {path} is not a checkpoint folder.{hint}")
    # open_hf_folder names what a would-be HF folder lacks (no config.json, no safetensors ...).
    open_hf_folder(path, what=WHAT)
    raise AssertionError("unreachable")  # pragma: no cover

# The model config a from-hf checkpoint keeps beside its weights (checked by its checksum).
HF_CONFIG_IN_CHECKPOINT = "hf_config.json"

@dataclasses.dataclass(frozen=True)
class StartingWeights:
    """``checkpoint.initial_load`` resolved once (by ``resolve_config``, carried on ``ResolvedConfig``).

    The Trainer, ``--dry-run`` and ``titan-convert`` read this value; none of them works out
    again what the source is or where the model's shape comes from.
    """

    #: "none" (no initial_load: the flavor's fresh weights), a Hugging Face folder, or a titan checkpoint
    kind: SourceKind
    path: Path | None
    #: the config.json the model's shape comes from (an HF folder's, or the hf_config.json a
    #: from-hf checkpoint carries); None when the shape is the flavor's
    shape_file: Path | None
    #: the model args of the run: the flavor's, or the shape file's with the spec section's runtime fields
    model_args: Any
    flavor: str

    def shape_source(self) -> str:
        """``flavor NAME``, or ``shape from FILE`` (for messages)."""
        return f"flavor {self.flavor}" if self.shape_file is None else f"shape from {self.shape_file}"

    def model_label(self, spec_name: str) -> str:
        """How the run log names its model: ``spec/flavor``, or the spec and the file its shape came from."""
        return f"{spec_name}/{self.flavor}" if self.shape_file is None else f"{spec_name} (shape from {self.shape_file})"

    def shape_note(self) -> str | None:
        """The line saying where the shape came from, when it is not the flavor's (printed by the Trainer)."""
        if self.shape_file is None:
            return None
        shape = ", ".join(f"{f.name}={getattr(self.model_args, f.name)}" for f in dataclasses.fields(self.model_args))
        return f"model shape from {self.shape_file} (model.flavor is ignored): {shape}"
