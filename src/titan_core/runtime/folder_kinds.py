"""What a folder on disk is, told by the files that mark it.

The lock taker (``folder_locks``) must refuse a titan checkpoint or a Hugging Face folder given
as a run folder before anything is written, and it sits below the packages that write those
folders. So the marker names live here, and ``checkpoint.layout`` and ``hf.folder`` take them
from this module: one definition, read by all three.
"""

from __future__ import annotations

from pathlib import Path

# written last, by rank 0, when a titan checkpoint is complete
TITAN_CHECKPOINT_MARKER = "titan_checkpoint.json"
# transformers' save_pretrained: one weights file, or an index over shards
HF_WEIGHTS_SINGLE = "model.safetensors"
HF_WEIGHTS_INDEX = "model.safetensors.index.json"
# written by ``titan-train --rehearse-rank`` into its run folder: one rank's shards and figures, not a run's
REHEARSAL_MARKER = "rehearsal.json"


def is_titan_checkpoint(path: Path) -> bool:
    return (Path(path) / TITAN_CHECKPOINT_MARKER).is_file()


def is_hf_folder(path: Path) -> bool:
    path = Path(path)
    return (path / "config.json").is_file() and (
        (path / HF_WEIGHTS_SINGLE).is_file() or (path / HF_WEIGHTS_INDEX).is_file())


def is_rehearsal_folder(path: Path) -> bool:
    return (Path(path) / REHEARSAL_MARKER).is_file()
