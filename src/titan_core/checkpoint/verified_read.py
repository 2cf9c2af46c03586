"""Read a checkpoint file's bytes from the very open file whose size and CRC-32 are checked.

Checking a file's digest and then opening it again to read leaves a window: a file
swapped (renamed over, rewritten) in between would be read unverified. Here each file
is opened once (``O_NOFOLLOW``: a symlink put in its place is refused), its size is
checked on that descriptor, and one sequential pass both hands the wanted byte ranges
to the caller and feeds every byte of the file into the CRC-32; the verdict comes at
the end of the pass. Memory stays at one range (one tensor chunk) plus a fixed buffer,
whatever the file's size.

The caller must treat what it was handed as unverified until ``read_verified``
returns: it may copy the bytes into their destination, but commits or returns them
only afterwards. A mismatch raises, which fails the whole load: a resume stops
before any step runs, so bytes already copied into the model are never trained on
or saved.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path

from ..errors import CheckpointError

__all__ = ["read_verified"]

_PIECE = 8 << 20


def read_verified(folder: Path, name: str, digest: tuple[int, int], spans: list[tuple[int, int]],
                  use: Callable[[int, int, bytearray], None]) -> None:
    """Call ``use(offset, length, bytes)`` for each distinct (offset, length) of ``spans`` in file order, then
    raise CheckpointError unless the whole file has the manifest's ``digest`` (size, CRC-32)."""
    path = folder / name
    want_size, want_crc = digest
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise CheckpointError(f"checkpoint file {path} cannot be opened ({exc.strerror}); it was removed or "
                              f"replaced after the checkpoint was verified") from exc
    with os.fdopen(fd, "rb", buffering=0) as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != want_size:
            raise CheckpointError(f"checkpoint file {path} is {st.st_size} bytes but was written with {want_size} "
                                  f"bytes (truncated or overwritten)")
        ordered = sorted(set(spans))
        for (a, la), (b, _) in zip(ordered, ordered[1:]):
            if a + la > b:
                raise CheckpointError(f"checkpoint {folder}: the tensor index makes two chunks of {name} overlap "
                                      f"(bytes {a}..{a + la} and from {b}); the index is forged or corrupt")
        crc, pos = 0, 0
        for offset, length in ordered:
            if offset + length > want_size:
                raise CheckpointError(f"checkpoint {folder}: bytes {offset}..{offset + length} lie beyond the end "
                                      f"of {name} ({want_size} bytes)")
            crc = _digest_until(fh, pos, offset, crc, path)
            data = _read_exact(fh, length, path)
            crc, pos = zlib.crc32(data, crc), offset + length
            use(offset, length, data)
        crc = _digest_until(fh, pos, want_size, crc, path)
        if fh.read(1):
            raise CheckpointError(f"checkpoint file {path} grew while it was read (overwritten during the load)")
    if crc != want_crc:
        raise CheckpointError(f"checkpoint file {path} does not match its recorded CRC-32 checksum (the file is "
                              f"corrupt, or was replaced while it was read); nothing read from it was used")


def _digest_until(fh: object, pos: int, end: int, crc: int, path: Path) -> int:
    while pos < end:
        piece = _read_exact(fh, min(_PIECE, end - pos), path)
        crc = zlib.crc32(piece, crc)
        pos += len(piece)
    return crc


def _read_exact(fh: object, length: int, path: Path) -> bytearray:
    data = bytearray(length)
    view, got = memoryview(data), 0
    while got < length:
        n = fh.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise CheckpointError(f"checkpoint file {path} ends early (truncated while it was read)")
        got += n
    return data
