"""The run folder's own files: ``config.toml`` written atomically, ``metrics.jsonl`` kept one record per step.

A resumed run redoes the steps after its checkpoint, and a fresh run in an old
folder starts again at step 1; appending alone would leave two records for those
steps. ``supersede_metrics`` moves every record past the starting step out of
``metrics.jsonl`` into ``metrics.superseded.jsonl`` (each marked with the step the
new run started from), so nothing is lost and ``metrics.jsonl`` holds one
timeline.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
from pathlib import Path
from typing import Any

from ..console import progress
from ..errors import ConfigError, TitanError
from .os_errors import describe_os_error
from .regular_files import read_regular, refuse_fifo

SUPERSEDED_FILE = "metrics.superseded.jsonl"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` so that a crash leaves either the old file or the new one, never half of it."""
    # surrogateescape: a run folder whose name is not UTF-8 is written back as its own bytes (toml_out.py).
    atomic_write_bytes(path, text.encode("utf-8", "surrogateescape"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``atomic_write_text`` for bytes; an interrupted write (Ctrl+C) leaves no temporary file behind."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
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
    """Move the records of steps after ``start_step`` out of ``path``; returns how many moved."""
    if not path.is_file():
        return 0
    kept: list[str] = []
    moved: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        step = _step_of(line)
        if step is not None and step > start_step:
            record = json.loads(line)
            record["superseded_by_run_from_step"] = start_step
            moved.append(json.dumps(record))
        elif line.strip():
            kept.append(line)
    if not moved:
        return 0
    try:
        with open(path.with_name(SUPERSEDED_FILE), "a", encoding="utf-8") as fh:
            fh.write("".join(f"{line}\n" for line in moved))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise TitanError(f"cannot write {path.with_name(SUPERSEDED_FILE)}: {exc}. Point --job.run_dir at a "
                         f"writable folder with free space.") from exc
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))
    progress(f"moved {len(moved)} record{'s' if len(moved) != 1 else ''} of steps after {start_step} from {path.name} to {SUPERSEDED_FILE} "
             f"(this run redoes those steps)", is_rank0=True)
    return len(moved)


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


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
