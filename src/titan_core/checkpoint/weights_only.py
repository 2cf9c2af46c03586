"""A checkpoint of the model weights alone, published with extra files (``titan-convert from-hf``).

It holds the model, a step counter and the RNG streams every checkpoint has, but no optimizer,
schedule or data position: it is read by ``checkpoint.initial_load`` and ``titan-convert to-hf``.
The extra files are written into the save's temporary folder and listed in its manifest
before the one rename that publishes it, so no reader ever sees the folder without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch import nn

from ..config.sections import CheckpointSection
from . import layout
from .identity import RunIdentity
from .manager import CheckpointManager
from .stateful import MODEL, ModelState


def write_weights_checkpoint(folder: Path, model_parts: list[nn.Module], *, identity: RunIdentity,
                             extra_files: Mapping[str, bytes], step: int = 0, is_rank0: bool = True,
                             failure_advice: str | None = None) -> Path:
    """Publish ``folder/step-N`` holding the weights of ``model_parts`` and ``extra_files``; its path.
    ``failure_advice``: the last sentence of the error when the save fails (the caller's own flag to change)."""
    config = CheckpointSection(enable=True, folder=".", keep_latest_k=0, async_mode="disabled")
    manager = CheckpointManager(config=config, run_dir=Path(folder), states={MODEL: ModelState(model_parts)},
                                extra_files=extra_files, identity=identity, is_rank0=is_rank0)
    if failure_advice is not None:
        manager.failure_advice = failure_advice
    manager.maybe_save(step, tokens_seen=0, last=True)
    manager.wait()
    return Path(folder) / layout.step_dirname(step)
