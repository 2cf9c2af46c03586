"""An ``OSError`` from the run's own files as one sentence: which file, what went wrong, what to do."""

from __future__ import annotations

import errno
import stat
from pathlib import Path

from ..errors import TitanError
from .path_settings import setting_for

__all__ = ["describe_os_error", "io_errno"]

_ADVICE = {
    errno.ENOSPC: ("disk full", "free space on that filesystem or point --job.run_dir at another one"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota or use another folder"),
    errno.EACCES: ("permission denied", "make it writable for this user or choose another --job.run_dir"),
    errno.EPERM: ("operation not permitted", "make it writable for this user or choose another --job.run_dir"),
    errno.EROFS: ("read-only filesystem", "choose a --job.run_dir on a writable filesystem"),
    errno.ENOTDIR: ("a path component is a file, not a folder", "remove or rename that file, or choose another path"),
    errno.EISDIR: ("it is a folder, where a file was expected", "remove or rename that folder"),
    errno.EEXIST: ("it already exists and is not a folder", "remove or rename it, or choose another --job.run_dir"),
    errno.ELOOP: ("it is a symbolic link, which the run refuses to follow", "replace the link by a real file"),
    errno.ENAMETOOLONG: ("the path is too long", "choose a shorter path"),
}


def describe_os_error(exc: OSError) -> TitanError:
    """A TitanError (exit 2) naming the file and the fix."""
    name = exc.filename if exc.filename is not None else "a file of the run"
    setting = None
    if exc.filename is not None:
        setting = setting_for(exc.filename)
    what, fix = _ADVICE.get(exc.errno or -1, (exc.strerror or str(exc), "check the path and its filesystem"))
    if exc.errno == errno.ENOSPC:
        message = f"disk full while writing {name}: {fix}. Checkpoints published before this are intact."
    else:
        message = f"cannot use {name}: {what} ([Errno {exc.errno}] {exc.strerror}); {fix}."
    if setting:
        message += f" The path comes from {setting}."
    return TitanError(message)


def io_errno(exc: BaseException) -> int | None:
    """The errno of an I/O failure: an OSError's, or the one safetensors' Rust writer reports in the text
    of its own exception type ("I/O error: No space left on device (os error 28)"); None for anything else."""
    if isinstance(exc, OSError):
        return exc.errno
    import re

    found = re.search(r"os error (\d+)", str(exc)) if type(exc).__name__ == "SafetensorError" else None
    return int(found.group(1)) if found else None


def file_kind(path: Path) -> str:
    """What a path that is not a regular file is, for messages (a FIFO, a socket, a device, ...)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return "unreadable"
    if stat.S_ISLNK(mode):
        return "a dangling symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
