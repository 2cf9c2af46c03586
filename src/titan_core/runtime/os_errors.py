"""An ``OSError`` from the run's own files as one sentence: which file, what went wrong, what to do."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import TitanError
from .path_settings import kept_after_failure, setting_for, unnamed_file_setting

__all__ = ["NotARegularFile", "describe_os_error", "io_errno"]


class NotARegularFile(OSError):
    """A run's or a tool's file is a FIFO, a folder, a device, ...: opening a FIFO would wait forever for a
    writer (or a reader), so it is refused instead (runtime/regular_files.py)."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(errno.EINVAL, f"it is {special_kind(path)}, not a regular file", str(path))

_ADVICE = {
    errno.ENOSPC: ("disk full", "free space on that filesystem or {move}"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota or use another folder"),
    errno.EACCES: ("permission denied", "make it writable for this user or choose another {where}"),
    errno.EPERM: ("operation not permitted", "make it writable for this user or choose another {where}"),
    errno.EROFS: ("read-only filesystem", "choose a {where} on a writable filesystem"),
    errno.ENOTDIR: ("a path component is a file, not a folder", "remove or rename that file, or choose another path"),
    errno.EISDIR: ("it is a folder, where a file was expected", "remove or rename that folder"),
    errno.EEXIST: ("it already exists and is not a folder", "remove or rename it, or choose another {where}"),
    errno.ELOOP: ("it is a symbolic link, which the run refuses to follow", "replace the link by a real file"),
    errno.ENAMETOOLONG: ("the path is too long", "choose a shorter path"),
}


def describe_os_error(exc: OSError) -> TitanError:
    """A TitanError (exit 2) naming the file and the fix."""
    name = exc.filename if exc.filename is not None else "a file of the run"
    setting = None
    if exc.filename is not None:
        setting = setting_for(exc.filename)
    elif (folder := unnamed_file_setting()) is not None:  # a tool that writes only under one flag's folder
        name, setting = f"a file in {folder[0]}", folder[1]
    what, fix = _ADVICE.get(exc.errno or -1, (exc.strerror or str(exc), "check the path and its filesystem"))
    # The flag to change is named only when a setting of this command chose the path: a tool's own flags
    # (titan-data's --out) are its own, and a flag it does not have (--job.run_dir) is no advice.
    # A config setting (dotted) is typed as a flag; a tool's own flag or positional (--out, OUT) as it is.
    flag = f"--{setting}" if setting is not None and "." in setting else setting
    fix = fix.format(where=flag if flag else "place",
                     move=f"point {flag} at another one" if flag else "write to another filesystem")
    if exc.errno == errno.EEXIST and exc.filename is not None and os.path.islink(exc.filename) \
            and not os.path.exists(exc.filename):
        what = f"it is a symbolic link to {os.readlink(exc.filename)}, which does not exist"
        fix = "remove the link, or create what it points to" + (f", or choose another {flag}" if flag else "")
    if isinstance(exc, NotARegularFile):
        message = f"cannot use {name}: {exc.strerror}; remove it, or put the file back, or choose another " \
                  f"{flag if flag else 'place'}."
    elif exc.errno == errno.ENOSPC:
        kept = kept_after_failure()
        message = f"disk full while writing {name}: {fix}." + (f" {kept}" if kept else "")
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


def not_a_folder(path: Path) -> str:
    """Why ``path`` is not a folder, in a message's words: ``does not exist``, ``is a regular file``,
    ``is a named pipe (FIFO)``, ... (a FIFO or device was once called "not a folder" only)."""
    if not os.path.lexists(path):
        return "does not exist"
    if path.is_file():
        return "is a regular file, not a folder"
    return f"is {file_kind(path)}, not a folder"


def special_kind(path: Path | str) -> str:
    """What a path that is not a regular file is: ``a folder``, or ``file_kind``'s words."""
    return "a folder" if os.path.isdir(path) else file_kind(Path(path))


def file_kind(path: Path) -> str:
    """What a path that is not a regular file is, for messages (a FIFO, a socket, a device, ...)."""
    try:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode) and os.path.exists(path):  # a link is named by what it points to
            mode = path.stat().st_mode
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
