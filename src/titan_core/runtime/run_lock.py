"""One run per run folder: an exclusive ``flock`` on ``<run_dir>/.lock`` for the life of the run.

Two runs writing one folder would interleave metrics, overwrite ``config.toml`` and
race each other's checkpoint saves and retention. The first run takes the lock; a
second run finds the holder in ``/proc/locks`` (pid, this host, its start time from
``/proc/<pid>``) and stops with exit code 2 before it writes anything.

Why ``flock`` and not "a lock file exists": the kernel releases a ``flock`` when its
holder dies (even by SIGKILL or a lost machine's process exit), so a crashed run
never leaves a lock behind that someone has to delete by hand; the next run simply
takes it over. The (empty) file itself stays and is reused.

Network filesystems: on NFSv4 and on Lustre/GPFS mounted with ``flock`` support,
``flock`` is enforced across machines. Some mounts (NFSv3 without lockd, Lustre
without ``-o flock``/``localflock``) either refuse it (``ENOLCK``/``EOPNOTSUPP``:
the run then warns and continues unlocked) or enforce it only per machine, so two
runs on two machines would not see each other there. Where the holder is on another
machine, its pid cannot be named (``/proc/locks`` shows local holders only); the message
says so. docs/running.md repeats this for operators.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..console import progress
from ..errors import RunFolderBusy

__all__ = ["LOCK_NAME", "RunLock", "acquire_run_lock"]

LOCK_NAME = ".lock"
# Set by the --nproc-per-node launcher, which holds the lock for its workers.
HELD_BY_LAUNCHER_ENV = "TITAN_RUN_LOCK_HELD"


@dataclass
class RunLock:
    """An acquired lock; ``release`` (or process exit) frees it."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def flock_entry(path: Path) -> list[str] | None:
    """The first flock on ``path`` in /proc/locks (this machine only), split into its fields:
    ``["1:", "FLOCK", "ADVISORY", "WRITE", "12345", "08:01:1234567", "0", "EOF"]``; None when there is none
    or it cannot be read. (A waiter's line has "->" in front and is not the first.)"""
    try:
        inode = path.stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return fields
    return None


def _holder_pid(path: Path) -> int | None:
    """The pid holding a flock on ``path``, from /proc/locks (this machine only)."""
    fields = flock_entry(path)
    if fields is not None:
        with contextlib.suppress(ValueError):
            return int(fields[4])
    return None


def _started(pid: int) -> str:
    """The process's start time (UTC) from /proc, or '?'."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        when = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return "?"
    return datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _holder_text(path: Path) -> str:
    pid = _holder_pid(path)
    if pid is None or pid <= 0:
        return ("a process on another machine (the folder is on a shared filesystem; this machine cannot see "
                "which one)")
    return f"pid {pid} on host {socket.gethostname()}, started {_started(pid)}"


def acquire_run_lock(run_dir: Path) -> RunLock:
    """Take ``<run_dir>/.lock`` (creating the folder if needed) or raise RunFolderBusy.

    Nothing is ever written into the lock file (it is created empty once), so neither a
    refused run nor a run that stops later changes any file by taking the lock.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunFolderBusy(
            f"the run folder {run_dir} is in use by another run: {_holder_text(path)}. Two runs in one folder "
            f"would overwrite each other's metrics and checkpoints. Wait for it to finish (or stop it), or pick "
            f"another folder with --job.run_dir=PATH."
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        os.close(fd)
        progress(f"warning: the filesystem of {run_dir} does not support file locks ({exc.strerror}); "
                 f"running without the one-run-per-folder lock", is_rank0=True)
        return RunLock(path, None)
    return RunLock(path, fd)


def lock_held_by_launcher(run_dir: Path) -> bool:
    """True in a worker whose launcher already holds this folder's lock."""
    held = os.environ.get(HELD_BY_LAUNCHER_ENV)
    return held is not None and held != "" and Path(held).resolve() == run_dir.resolve()
