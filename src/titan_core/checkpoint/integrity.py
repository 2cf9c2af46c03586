"""Per-file sizes and CRC-32s: a damaged shard is named instead of silently loaded.

DCP stores tensor bytes without a checksum, so garbage written over a shard would
load as wrong numbers. Ranks split the files between them (file i goes to rank
i mod world) both when digesting after a save and when verifying before a load.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from .layout import IDENTITY_FILE

_CHUNK = 8 << 20


def file_digest(path: Path) -> tuple[int, int]:
    """(size in bytes, CRC-32) of one file."""
    crc = 0
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def checkpoint_files(folder: Path) -> list[str]:
    """Every file of a checkpoint except the identity file (which holds the digests), sorted."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != IDENTITY_FILE)


def digest_share(folder: Path, *, rank: int, world: int) -> dict[str, tuple[int, int]]:
    """Digests of this rank's share of the files in ``folder``."""
    names = checkpoint_files(folder)
    return {name: file_digest(folder / name) for name in names[rank::world]}


def verify_share(folder: Path, expected: dict[str, tuple[int, int]], *, rank: int, world: int) -> str | None:
    """Check this rank's share of ``expected``; returns a message naming the first bad file, or None."""
    for name in sorted(expected)[rank::world]:
        path = folder / name
        if not path.is_file():
            return f"checkpoint file {path} is missing"
        try:
            size, crc = file_digest(path)
        except OSError as exc:  # returned, not raised: the other ranks wait for this answer
            return f"checkpoint file {path} cannot be read: {exc}"
        want_size, want_crc = expected[name]
        if size != want_size:
            return f"checkpoint file {path} is {size} bytes but was written with {want_size} bytes (truncated or overwritten)"
        if crc != want_crc:
            return f"checkpoint file {path} does not match its recorded CRC-32 checksum (the file is corrupt)"
    return None
