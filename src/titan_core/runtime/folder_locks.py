"""Every folder a run writes is locked for the life of the run, not only its run folder.

``run_lock`` keeps one run per run folder through ``<run_dir>/.lock``. That alone let a
second run whose ``--checkpoint.folder`` pointed into a live run's checkpoints delete the
live run's in-flight save and older checkpoints, and a deleted ``.lock`` let a second run
into the same folder. So the owner of a run (rank 0, or the ``--nproc-per-node`` launcher)
also takes ``flock``s on the folders themselves, through file descriptors opened on the
directories (a directory cannot be deleted by accident while it holds files, and deleting
``.lock`` does not touch it):

* an exclusive lock on each folder it writes: the run folder, the checkpoint folder (with
  ``checkpoint.enable``) and the export folder (with ``checkpoint.export_at_end``), each
  after resolving symbolic links, so whatever flags or links lead to a folder, it is one;
* a shared lock on every folder above those, so a run writing *inside* another live run's
  folder (its exclusive lock conflicts with the shared one) and a run writing a folder that
  *contains* a live run's folder are refused too, while runs side by side (``runs/a`` and
  ``runs/b`` share ``runs/``) are not.

The kernel drops all of them when the process dies, however it dies. A folder that does not
exist yet is created only after the locks above it were taken, so a refused run creates
nothing. A titan checkpoint, a folder of checkpoints or a Hugging Face folder given as the run
folder (or the checkpoint folder) is refused before anything is written: the run would write
its own files into it and break it.

On a filesystem whose ``flock`` does not cover directories (NFS emulates ``flock`` with
byte-range locks, which need a file open for writing), the directory locks are skipped and
the ``.lock`` file is what keeps one run per run folder, as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, RunFolderBusy
from .folder_kinds import REHEARSAL_MARKER, is_hf_folder, is_rehearsal_folder, is_titan_checkpoint
from .run_lock import RunLock, _holder_text, acquire_run_lock, flock_entry

if TYPE_CHECKING:
    from ..config.job import JobConfig

__all__ = ["HeldFolders", "WrittenFolder", "acquire_run_folders", "written_folders"]

_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EINVAL)
_FIX = ("Two runs writing one folder would overwrite or delete each other's metrics and checkpoints. Wait for "
        "the other run to finish (or stop it), or give this run folders of its own (--job.run_dir, "
        "--checkpoint.folder).")


@dataclass(frozen=True)
class WrittenFolder:
    path: Path  # absolute, symbolic links resolved
    role: str  # "run folder", "checkpoint folder (checkpoint.folder)", ...


def written_folders(config: JobConfig) -> list[WrittenFolder]:
    """The folders this run writes, from the config (flags, --config and defaults alike)."""
    run_dir = Path(config.job.run_dir).expanduser()
    folders = [WrittenFolder(run_dir.resolve(), "run folder")]
    if config.checkpoint.enable:
        folders.append(WrittenFolder((run_dir / config.checkpoint.folder).expanduser().resolve(),
                                     "checkpoint folder (checkpoint.folder)"))
    if config.checkpoint.export_at_end:
        folders.append(WrittenFolder((run_dir / "export").resolve(), "export folder (checkpoint.export_at_end)"))
    return folders


def _what_it_is(folder: Path) -> str | None:
    """Why ``folder`` must not receive a run's files: it is a checkpoint or a Hugging Face folder."""

    if is_titan_checkpoint(folder):
        return "a titan checkpoint (it holds titan_checkpoint.json)"
    if is_hf_folder(folder):
        return "a Hugging Face model folder (config.json and safetensors)"
    return None


def refuse_rehearsal_folder(run_dir: Path) -> None:
    """A run in a rehearsal's folder would resume from (or be refused by) one rank's checkpoint shards, and its
    metrics would continue a fake process group's."""
    if is_rehearsal_folder(run_dir):
        raise ConfigError(
            f"the run folder {run_dir} holds a rehearsal (titan-train --rehearse-rank: one rank's checkpoint shards "
            f"and figures under a fake process group, {REHEARSAL_MARKER}), not a training run. Give the run a folder "
            f"of its own (e.g. --job.run_dir=runs/NAME), or delete the rehearsal's folder first.")


def refuse_foreign_folders(folders: list[WrittenFolder]) -> None:
    """A checkpoint or Hugging Face folder (or a folder inside one) given as a folder the run writes."""

    checkpoint_folders = {f.path for f in folders if f.role.startswith("checkpoint folder")}
    for folder in folders:
        for place in (folder.path, *folder.path.parents):
            what = _what_it_is(place)
            if what is not None:
                where = "is" if place == folder.path else f"lies inside {place}, which is"
                raise ConfigError(
                    f"the {folder.role} {folder.path} {where} {what}; the run would write its own files into it "
                    f"and break it. Give the run a folder of its own (e.g. --job.run_dir=runs/NAME); to start "
                    f"from those weights use --checkpoint.initial_load={place}.")
        # A run's checkpoints/ folder as the run folder: this run would save beside them and its
        # retention (keep_latest_k) would count and delete the other run's checkpoints as its own.
        if folder.role == "run folder" and folder.path not in checkpoint_folders and folder.path.is_dir():
            steps = sorted(p for p in folder.path.glob("step-*") if is_titan_checkpoint(p))
            if steps:
                raise ConfigError(
                    f"the run folder {folder.path} is a folder of titan checkpoints ({len(steps)} step-N folders, "
                    f"e.g. {steps[-1].name}), not a run folder. Give the run a folder of its own (e.g. "
                    f"--job.run_dir=runs/NAME); to start from one of them use "
                    f"--checkpoint.initial_load={steps[-1]}, or to resume that run give its run folder "
                    f"{folder.path.parent}.")


@dataclass
class HeldFolders:
    """The run folder's ``.lock`` plus the directory locks; ``release`` (or process exit) frees them."""

    run_lock: RunLock
    fds: list[int] = field(default_factory=list)

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the last descriptor drops its flock
        self.fds.clear()
        self.run_lock.release()


class _Locker:
    def __init__(self) -> None:
        self.held: dict[Path, int] = {}
        self.supported = True

    def take(self, path: Path, *, exclusive: bool) -> bool:
        """Lock ``path`` (an existing folder); False when another process holds a conflicting lock."""
        if path in self.held or not self.supported:
            return True
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return True  # a folder above the run this user may not open: nothing of ours to guard there
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _UNSUPPORTED:
                raise
            self.supported = False  # see the module docstring: the .lock file still guards the run folder
            return True
        self.held[path] = fd
        return True

    def release(self) -> None:
        for fd in self.held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.held.clear()


def _busy(folder: WrittenFolder, place: Path) -> RunFolderBusy:
    if place.name == "*":  # a shared lock on our folder: a run writes somewhere below it
        return RunFolderBusy(f"the {folder.role} {folder.path} contains a folder that another run is writing: "
                             f"{_holder_text(folder.path)}. {_FIX}")
    holder = _holder_text(place)
    if place == folder.path:
        if folder.role == "run folder":
            return RunFolderBusy(f"the run folder {place} is in use by another run: {holder}. {_FIX}")
        return RunFolderBusy(f"the {folder.role} {place} is in use by another run: {holder}. {_FIX}")
    return RunFolderBusy(f"the {folder.role} {folder.path} lies inside {place}, which another run is writing: "
                         f"{holder}. {_FIX}")


def _lock_all(locker: _Locker, folders: list[WrittenFolder]) -> None:
    """Shared locks above, exclusive locks on the folders themselves (existing ones only)."""
    targets = {f.path for f in folders}
    for folder in folders:
        for place in reversed(folder.path.parents):  # from / down
            if place not in targets and place.is_dir() and not locker.take(place, exclusive=False):
                raise _busy(folder, place)
    for folder in folders:
        if folder.path.is_dir() and not locker.take(folder.path, exclusive=True):
            # Another run holds this very folder (exclusive), or writes below it (shared).
            raise _busy(folder, folder.path if _held_exclusively(folder.path) else folder.path / "*")


def _held_exclusively(path: Path) -> bool:
    """Whether another process's lock on ``path`` is exclusive (from /proc/locks; True when unknown)."""
    fields = flock_entry(path)
    return fields is None or fields[3] == "WRITE"


def acquire_run_folders(config: JobConfig, *, run_folder_only: bool = False, rehearsal: bool = False) -> HeldFolders:
    """Lock every folder the run writes, or raise (RunFolderBusy / ConfigError) having changed nothing.

    ``run_folder_only``: the caller's runs write below the run folder only (--compare-baseline).
    ``rehearsal``: the caller is ``--rehearse-rank``, whose run folder is a rehearsal's own.
    """
    folders = written_folders(config)[:1] if run_folder_only else written_folders(config)
    refuse_foreign_folders(folders)
    if not rehearsal:
        refuse_rehearsal_folder(folders[0].path)
    locker = _Locker()
    try:
        _lock_all(locker, folders)  # the folders that exist: a refused run has created nothing yet
        run_lock = acquire_run_lock(Path(config.job.run_dir))  # creates the run folder
    except BaseException:
        locker.release()
        raise
    try:
        for folder in folders[1:]:
            with contextlib.suppress(OSError):  # an unwritable place is reported by the run's own checks
                folder.path.mkdir(parents=True, exist_ok=True)
        _lock_all(locker, folders)  # again, for the folders just created (and the ones made above them)
    except BaseException:
        locker.release()
        run_lock.release()
        raise
    return HeldFolders(run_lock, list(locker.held.values()))
