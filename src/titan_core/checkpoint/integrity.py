"""Per-file sizes and CRC-32s: a damaged shard is named instead of silently loaded.

DCP stores tensor bytes without a checksum, so garbage written over a shard would
load as wrong numbers. Ranks split the files between them (file i goes to rank
i mod world) both when digesting after a save and when verifying before a load.

The manifest is also the list of what may be read: ``check_listing`` refuses a
folder holding anything it does not list (or a symlink, or a name with a folder
part) before any byte is read. A CRC-32 detects accidents, not an attacker, who
can rewrite the manifest too: see "Threat model" in docs/checkpointing.md.
"""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

from .layout import IDENTITY_FILE
from .tensor_index import is_plain_name

_CHUNK = 8 << 20


def file_digest(path: Path) -> tuple[int, int]:
    """(size in bytes, CRC-32) of one file."""
    crc = 0
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # a symlink is refused, not followed
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def checkpoint_files(folder: Path) -> list[str]:
    """Every file of a checkpoint except the identity file (which holds the digests), sorted."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.is_symlink() and p.name != IDENTITY_FILE)


def check_listing(folder: Path, manifest: dict[str, tuple[int, int]]) -> None:
    """Raise ValueError unless ``folder`` holds exactly the manifest's plain files plus the identity file."""
    for name in sorted(manifest):
        if not is_plain_name(name) or name == IDENTITY_FILE:
            raise ValueError(f"its manifest names {name!r}, which is not a plain file name inside the folder")
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name == IDENTITY_FILE and entry.is_file(follow_symlinks=False):
            continue
        if entry.name not in manifest:
            raise ValueError(f"it holds {entry.name!r}, which its manifest does not list (titan-core reads only "
                             f"listed files; remove the extra entry or use another checkpoint)")
        mode = entry.stat(follow_symlinks=False).st_mode
        if not stat.S_ISREG(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise ValueError(f"its file {entry.name!r} is {kind}; a checkpoint holds only regular files")


def digest_share(folder: Path, *, rank: int, world: int) -> dict[str, tuple[int, int]]:
    """Digests of this rank's share of the files in ``folder``."""
    names = checkpoint_files(folder)
    return {name: file_digest(folder / name) for name in names[rank::world]}


def verify_share(folder: Path, expected: dict[str, tuple[int, int]], *, rank: int, world: int) -> str | None:
    """Check this rank's share of ``expected``; returns a message naming the first bad file, or None."""
    for name in sorted(expected)[rank::world]:
        path = folder / name
        if not path.is_file() or path.is_symlink():
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
