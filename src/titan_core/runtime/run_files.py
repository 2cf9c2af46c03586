"""The run folder's own files: ``config.toml`` written atomically, ``metrics.jsonl`` kept one record per step.

A resumed run redoes the steps after its checkpoint, and a fresh run in an old
folder starts again at step 1; appending alone would leave two records for those
steps. ``supersede_metrics`` moves every record past the starting step out of
``metrics.jsonl`` into ``metrics.superseded.jsonl`` (each marked with the step the
new run started from), so nothing is lost and ``metrics.jsonl`` holds one
timeline.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ..console import progress
from ..errors import ConfigError, TitanError
from .os_errors import describe_os_error
from .regular_files import LINE_LIMIT, bounded_lines, open_regular, read_regular, refuse_fifo

SUPERSEDED_FILE = "metrics.superseded.jsonl"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` so that a crash leaves either the old file or the new one, never half of it."""
    # surrogateescape: a run folder whose name is not UTF-8 is written back as its own bytes (toml_out.py).
    atomic_write_bytes(path, text.encode("utf-8", "surrogateescape"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``atomic_write_text`` for bytes; an interrupted write (Ctrl+C) leaves no temporary file behind."""
    with atomic_file(path) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write ``path``'s new bytes into, a piece at a time: it replaces ``path`` when the block ends
    without an error (a crash leaves the old file or the new one); an error or Ctrl+C leaves no temporary file."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if not isinstance(exc, OSError):
            raise
        # Name the file the user knows (not the temporary one): "disk full while writing .../config.toml".
        raise describe_os_error(OSError(exc.errno, exc.strerror, str(path))) from exc


def require_writable(*, folders: list[Path], files: list[Path]) -> None:
    """Raise the OSError (naming the path) that writing would raise later, before the run writes anything.

    A read-only or foreign-owned ``config.toml`` or ``metrics.jsonl``, a run folder on a read-only
    filesystem or a folder this user may not write would otherwise stop the run after it had already
    rewritten some files and trained. Probing leaves no trace: an existing file is opened for appending
    and closed unwritten, a folder gets an unnamed temporary file. A path that does not exist yet is
    skipped (creating it will be checked where it happens).
    """
    import tempfile

    for folder in folders:
        if folder.is_dir():
            try:
                tempfile.TemporaryFile(dir=folder).close()
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(folder)) from exc
        elif folder.exists() or folder.is_symlink():
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
    for path in files:
        if path.exists() and not path.is_dir():
            refuse_fifo(path)  # a FIFO would hold the open below forever
            with open(path, "a", encoding="utf-8"):
                pass
            if not os.access(path, os.W_OK):  # opened by a privileged user, still read-only by its mode
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))


def supersede_metrics(path: Path, *, start_step: int) -> int:
    """Move the records of steps after ``start_step`` out of ``path``; returns how many moved.

    The file is read a line at a time, twice (the moved records are appended to the superseded file, then the
    kept lines are written to ``path``'s replacement), so a line of gigabytes is never held in memory. A line
    longer than ``LINE_LIMIT`` is not a record: it is kept, as any other line that is not one, copied byte for
    byte a piece at a time."""
    if not path.is_file():
        return 0
    with open_regular(path) as f:
        moved = _set_aside(f, path, start_step)
        if not moved:
            return 0
        f.seek(0)
        with atomic_file(path) as out:
            _write_kept(f, out, start_step)
    progress(f"moved {moved} record{'s' if moved != 1 else ''} of steps after {start_step} from {path.name} to {SUPERSEDED_FILE} "
             f"(this run redoes those steps)", is_rank0=True)
    return moved


def _lines(f: BinaryIO) -> Iterator[str | tuple[int, int]]:
    """The lines of ``f`` as ``str.splitlines`` splits the file's text (bad bytes replaced by U+FFFD); for a line
    longer than ``LINE_LIMIT``, its byte range in ``f`` instead."""
    start = f.tell()
    for raw in bounded_lines(f):
        end = f.tell()
        if raw is None:
            yield start, end
        else:
            yield from raw.decode("utf-8", errors="replace").splitlines()
        start = end


def _set_aside(f: BinaryIO, path: Path, start_step: int) -> int:
    """Append the records of ``f`` (``path``'s) past ``start_step`` to the superseded file beside it (each marked
    with ``start_step``), opened only when there is one; how many."""
    superseded = path.with_name(SUPERSEDED_FILE)
    moved = 0
    writing = False  # which side an OSError came from: reading path, or writing the superseded file
    try:
        with contextlib.ExitStack() as stack:
            out: TextIO | None = None
            for line in _lines(f):
                record = _later_record(line, start_step)
                if record is None:
                    continue
                writing = True
                if out is None:
                    out = stack.enter_context(open(superseded, "a", encoding="utf-8"))
                out.write(json.dumps(record) + "\n")
                writing = False
                moved += 1
            if out is not None:
                writing = True
                out.flush()
                os.fsync(out.fileno())
    except OSError as exc:
        if not writing:
            raise TitanError(f"cannot read {path} to resume: {exc}. Check the disk, or move the run folder's "
                             f"metrics.jsonl aside and resume again (the checkpoint does not need it).") from exc
        raise TitanError(f"cannot write {superseded}: {exc}. Point --job.run_dir at a writable folder with free "
                         f"space.") from exc
    return moved


def _write_kept(f: BinaryIO, out: BinaryIO, start_step: int) -> None:
    """Every line of ``f`` that ``_set_aside`` did not move, to ``out``: blank lines are dropped, a line longer
    than ``LINE_LIMIT`` is copied as it is, a piece at a time."""
    for line in _lines(f):
        if isinstance(line, tuple):
            start, end = line
            f.seek(start)
            last = b""
            while start < end and (piece := f.read(min(LINE_LIMIT, end - start))):
                out.write(piece)
                start, last = start + len(piece), piece
            if not last.endswith(b"\n"):  # the file's last line, without its newline
                out.write(b"\n")
            f.seek(end)
        elif line.strip() and _later_record(line, start_step) is None:
            out.write(f"{line}\n".encode())


def _later_record(line: str | tuple[int, int], start_step: int) -> dict[str, Any] | None:
    """The record ``line`` holds, marked as superseded, when its step is past ``start_step``; None otherwise (a
    record of an earlier step, a line that is not a record)."""
    if isinstance(line, tuple):  # longer than any record: not one
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: brackets nested past the parser's depth
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step <= start_step:
        return None
    record["superseded_by_run_from_step"] = start_step
    return record


def read_run_config(path: Path | None) -> dict[str, Any]:
    """A run's ``config.toml`` as a dict ({} for None); ConfigError naming it when unreadable."""
    if path is None:
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(read_regular(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ConfigError(f"cannot read the run config {path}: {exc}") from None
