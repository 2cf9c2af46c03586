"""Read a checkpoint's full tensors outside training (inspection, conversion), with every check resume makes.

``read_checkpoint_tensors(folder)`` verifies the listing and the manifest's sizes
and CRC-32s, parses the tensor index, and assembles each tensor from its chunks
(whatever layout wrote it) as a plain CPU tensor, from the same bytes whose CRC-32
was checked; nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from . import integrity, layout
from .identity import CheckpointRecord, read_record
from .tensor_index import Chunk, read_index
from .verified_read import read_verified


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
    index = read_index(folder, record.files)
    out = {fqn: torch.empty(entry.size, dtype=entry.dtype) for fqn, entry in sorted(index.tensors.items())}
    by_file: dict[str, dict[tuple[int, int], list[tuple[str, Chunk]]]] = {}
    for fqn, entry in index.tensors.items():
        for chunk in entry.chunks:
            by_file.setdefault(chunk.file, {}).setdefault((chunk.offset, chunk.length), []).append((fqn, chunk))
    for name, by_span in sorted(by_file.items()):

        def use(offset: int, length: int, data: bytearray,
                by_span: dict[tuple[int, int], list[tuple[str, Chunk]]] = by_span) -> None:
            for fqn, chunk in by_span[(offset, length)]:
                dtype = out[fqn].dtype
                values = torch.frombuffer(data, dtype=dtype) if length else torch.empty(0, dtype=dtype)
                region = out[fqn]
                for dim, (start, size) in enumerate(zip(chunk.offsets, chunk.sizes)):
                    region = region.narrow(dim, start, size)
                region.copy_(values.reshape(chunk.sizes))

        # the bytes used are the bytes checked (verified_read.py); nothing is returned unless all matched
        read_verified(folder, name, record.files[name], list(by_span), use)
    return out
