"""What a ``checkpoint.initial_load`` path is, and the names of the files that record it.

The bottom of the starting-weights package: the loader, the shape reader and the
checkpoint model-args reader all name these, so none of them imports another for them.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..hf.folder import is_hf_folder, open_hf_folder
from .titan_checkpoint import is_titan_checkpoint, run_folder_hint

WHAT = "checkpoint.initial_load"
# The config.json a run's shape came from, as it was when the run started (in the run folder).
RECORDED = "initial_load_config.json"


def source_kind(path: Path) -> str:
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
