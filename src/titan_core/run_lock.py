"""One run per run folder: an exclusive ``flock`` on ``<run_dir>/.lock`` for the life of the run.

Two runs writing one folder would interleave metrics, overwrite ``config.toml`` and
race each other's checkpoint saves and retention. The first run takes the lock; a
second run reads who holds it (pid, host, start time, written into the lock file by
the holder) and stops with exit code 2 before it writes anything.

Why ``flock`` and not "a lock file exists": the kernel releases a ``flock`` when its
holder dies (even by SIGKILL or a lost machine's process exit), so a crashed run
never leaves a lock behind that someone has to delete by hand; the next run simply
takes it over. The file itself stays (with the dead holder's details) and is reused.

Network filesystems: on NFSv4 and on Lustre/GPFS mounted with ``flock`` support,
``flock`` is enforced across machines. Some mounts (NFSv3 without lockd, Lustre
without ``-o flock``/``localflock``) either refuse it (``ENOLCK``/``EOPNOTSUPP``:
the run then warns and continues unlocked) or enforce it only per machine, so two
runs on two machines would not see each other there. docs/running.md says this.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .errors import TitanError

__all__ = ["LOCK_NAME", "RunFolderBusy", "RunLock", "acquire_run_lock"]

LOCK_NAME = ".lock"
# Set by the --nproc-per-node launcher, which holds the lock for its workers.
HELD_BY_LAUNCHER_ENV = "TITAN_RUN_LOCK_HELD"


class RunFolderBusy(TitanError):
    """Another live run holds the run folder's lock."""


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


def _holder_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if not fields:
        return "another process (its details are not recorded yet)"
    return (f"pid {fields.get('pid', '?')} on host {fields.get('host', '?')}, "
            f"started {fields.get('started', '?')}")


def acquire_run_lock(run_dir: Path, *, command: str = "titan-train") -> RunLock:
    """Take ``<run_dir>/.lock`` (creating the folder if needed) or raise RunFolderBusy.

    A refused run touches nothing: the lock file is opened without truncation and
    only the holder ever writes into it.
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
        from .metrics import progress

        progress(f"warning: the filesystem of {run_dir} does not support file locks ({exc.strerror}); "
                 f"running without the one-run-per-folder lock", is_rank0=True)
        return RunLock(path, None)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    record = f"pid={os.getpid()}\nhost={socket.gethostname()}\nstarted={started}\ncommand={command}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode(), 0)
    return RunLock(path, fd)


def lock_held_by_launcher(run_dir: Path) -> bool:
    """True in a worker whose launcher already holds this folder's lock."""
    held = os.environ.get(HELD_BY_LAUNCHER_ENV)
    return bool(held) and Path(held).resolve() == run_dir.resolve()
