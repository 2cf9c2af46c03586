"""Reading (or probing) a file that someone else's hands may have replaced: metrics.jsonl, ft_events.jsonl,
config.toml, a shard set's index.json and .verified.json, titan-data prepare's records.

``open_regular`` opens only a regular file: a named pipe (FIFO) put in such a file's place would block the
open and every read forever (titan-train then did not even stop on SIGTERM), a folder or a device is not
the file either. ``bounded_lines`` gives a file's lines, each cut at ``LINE_LIMIT`` bytes: a file of
gigabytes without a newline is never held whole in memory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .os_errors import NotARegularFile

__all__ = ["LINE_LIMIT", "NotARegularFile", "bounded_lines", "open_regular", "read_record_lines", "read_regular",
           "refuse_fifo"]

# No record line a titan run writes comes near this; a longer line is not a record (it is skipped and counted).
LINE_LIMIT = 1 << 20


def open_regular(path: Path) -> BinaryIO:
    """``path`` (links followed) opened for binary reading; NotARegularFile (an OSError) when it is not a
    regular file, checked on the opened file: a FIFO is opened without blocking and never read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path) -> bytes:
    """The bytes of the regular file ``path``; OSError (NotARegularFile for a FIFO, a folder, ...) otherwise."""
    with open_regular(path) as f:
        return f.read()


def refuse_fifo(path: Path) -> None:
    """NotARegularFile when ``path`` (links followed) is a named pipe: a file about to be opened for writing,
    where a FIFO would wait forever for a reader. A device is left to the open (/dev/null, /dev/full write)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if stat.S_ISFIFO(mode):
        raise NotARegularFile(path)


def bounded_lines(f: BinaryIO, limit: int = LINE_LIMIT) -> Iterator[bytes | None]:
    """Each line of ``f`` (newline kept); None for a line longer than ``limit`` bytes, whose rest is read
    past in pieces of ``limit`` bytes."""
    while raw := f.readline(limit):
        if len(raw) == limit and not raw.endswith(b"\n"):  # longer than any record: read past the rest of it
            rest = raw
            while rest and not rest.endswith(b"\n"):
                rest = f.readline(limit)
            yield None
            continue
        yield raw


def read_record_lines(path: Path) -> list[bytes | None]:
    """Every line of the regular file ``path`` (None for one past ``LINE_LIMIT``); OSError when it is missing,
    unreadable or not a regular file."""
    with open_regular(path) as f:
        return list(bounded_lines(f))
