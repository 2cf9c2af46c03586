"""Read a checkpoint's full tensors outside training (inspection, conversion), with every check resume makes.

``read_checkpoint_tensors(folder)`` verifies the listing and the manifest's sizes
and CRC-32s, parses the tensor index, and assembles each tensor from its chunks
(whatever layout wrote it) as a plain CPU tensor; nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from . import integrity, layout
from .identity import CheckpointRecord, read_record
from .tensor_index import read_index


def open_checked_record(folder: Path) -> CheckpointRecord:
    """The identity record of ``folder`` after the checks every reader makes before trusting a byte:
    not a symlink, not the old pickled format, complete, and holding exactly the files it lists."""
    if folder.is_symlink():
        raise CheckpointError(f"checkpoint {folder} is a symbolic link; pass the folder it points to")
    if layout.is_legacy(folder):
        raise layout.legacy_error(folder)
    layout.require_complete(folder)
    record = read_record(folder)
    try:
        integrity.check_listing(folder, record.files)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {folder} cannot be trusted: {exc}.") from exc
    return record


def read_checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in ``folder`` by its state-dict key (``model.<fqn>``, ``optimizer.state...``)."""
    folder = Path(folder)
    record = open_checked_record(folder)
    problem = integrity.verify_share(folder, record.files, rank=0, world=1)
    if problem:
        raise CheckpointError(problem)
    index = read_index(folder, {name: size for name, (size, _) in record.files.items()})
    out: dict[str, torch.Tensor] = {}
    for fqn, entry in sorted(index.tensors.items()):
        full = torch.empty(entry.size, dtype=entry.dtype)
        for chunk in entry.chunks:
            with open(folder / chunk.file, "rb") as fh:
                fh.seek(chunk.offset)
                raw = fh.read(chunk.length)
            values = torch.frombuffer(bytearray(raw), dtype=entry.dtype) if raw else torch.empty(0, dtype=entry.dtype)
            region = full
            for dim, (start, size) in enumerate(zip(chunk.offsets, chunk.sizes)):
                region = region.narrow(dim, start, size)
            region.copy_(values.reshape(chunk.sizes))
        out[fqn] = full
    return out
