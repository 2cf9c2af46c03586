"""Where checkpoints live on disk, which ones count, and how one is published.

A run's checkpoint folder holds:

* ``step-000010/``: a published checkpoint (raw tensor shards ``__<rank>_0.distcp``,
  ``tensor_index.json`` and our ``titan_checkpoint.json``);
* ``.tmp-step-000010-<nonce>/``: a save in progress (or one a crash interrupted);
* ``.old-step-000010-<nonce>/``: a published folder being replaced by a newer
  save of the same step.

Only real ``step-N`` folders (not symlinks) holding both ``tensor_index.json`` and
the identity file count as checkpoints. A save becomes visible in one ``os.rename``
of its temporary folder, so a crash at any moment leaves either the previous
checkpoints or the new one.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from ..errors import CheckpointError
from ..runtime.folder_kinds import TITAN_CHECKPOINT_MARKER
from ..runtime.os_errors import describe_os_error
from .tensor_index import INDEX_FILE

LEGACY_METADATA_FILE = ".metadata"  # DCP's pickled index: written by titan-core before it stored JSON
IDENTITY_FILE = TITAN_CHECKPOINT_MARKER  # written by us, last, by rank 0

_STEP_RE = re.compile(r"^step-(\d+)$")
_STALE_PREFIXES = (".tmp-step-", ".old-step-")


def step_dirname(step: int) -> str:
    """``step-000010``: zero-padded so that a plain listing sorts by step."""
    return f"step-{step:06d}"


def tmp_dirname(step: int) -> str:
    """A fresh temporary folder name for a save of ``step`` (unique per attempt)."""
    return f".tmp-{step_dirname(step)}-{secrets.token_hex(4)}"


def step_of(name: str) -> int | None:
    """The step a ``step-N`` folder name claims, or None for any other name."""
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def missing_parts(path: Path) -> list[str]:
    """The files a complete checkpoint needs that ``path`` lacks (empty when complete)."""
    if not path.is_dir():
        return [f"the folder {path} itself"]
    return [name for name in (INDEX_FILE, IDENTITY_FILE) if not (path / name).is_file()]


def is_legacy(path: Path) -> bool:
    """A checkpoint written by a titan-core that stored DCP's pickled ``.metadata`` (never read now)."""
    return (path / LEGACY_METADATA_FILE).is_file() and not (path / INDEX_FILE).exists()


def legacy_error(path: Path) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} was written by an older titan-core: its tensor index is DCP's pickled .metadata, "
        f"and loading a pickle from disk can run arbitrary code, so resume does not read it. If you trust where "
        f"the folder came from, convert it once: python -m titan_core.checkpoint.legacy --i-trust-this-checkpoint "
        f"{path} <new folder>/{path.name}, and resume from the new folder (or resume it with the titan-core "
        f"version that wrote it); otherwise start fresh: --checkpoint.resume=never, or another --job.run_dir."
    )


def require_complete(path: Path) -> None:
    """Raise CheckpointError naming what is missing unless ``path`` is a complete checkpoint."""
    missing = missing_parts(path)
    if missing:
        raise CheckpointError(
            f"{path} is not a complete checkpoint: missing {', '.join(missing)}. A checkpoint folder is only "
            f"complete once its save finished and was published; pick another step-N folder or set "
            f"--checkpoint.resume=auto to use the newest complete one."
        )


def complete_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """Published, complete checkpoints in ``folder``, oldest first, as (step its name claims, path).

    Symlinks are never checkpoints: a link could point at another run's folder,
    and retention must never delete through one.
    """
    if not folder.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for entry in folder.iterdir():
        step = step_of(entry.name)
        if step is not None and not entry.is_symlink() and not missing_parts(entry):
            found.append((step, entry))
    return sorted(found)


def step_folders(folder: Path) -> list[tuple[int, Path]]:
    """Every entry named ``step-N`` (complete or not, links included), oldest first."""
    if not folder.is_dir():
        return []
    return sorted((step, entry) for entry in folder.iterdir() if (step := step_of(entry.name)) is not None)


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint in ``folder``, or None."""
    found = complete_checkpoints(folder)
    return found[-1][1] if found else None


def remove_stale(folder: Path) -> list[Path]:
    """Delete temporary folders left by interrupted saves; returns what was removed.

    Call only when no save of this run is in flight (at startup, on rank 0).
    """
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        if entry.name.startswith(_STALE_PREFIXES) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a rename is only on disk once its folder is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Atomically make the finished save in ``tmp`` visible as ``final``.

    ``rename`` cannot replace a non-empty folder, so an existing ``final`` (the same
    step saved by an earlier run) is first moved aside and deleted afterwards.
    """
    old: Path | None = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{secrets.token_hex(4)}")
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if old is not None and old.is_symlink():
        old.unlink()  # a link in the way is removed, never followed: what it points to stays
    elif old is not None:
        shutil.rmtree(old, ignore_errors=True)


def apply_retention(folder: Path, keep_latest_k: int, *, protect: Path, deletable: Callable[[int, Path], bool]) -> list[Path]:
    """Delete the checkpoints ``deletable`` allows beyond the newest ``keep_latest_k`` (0 keeps all).

    ``protect`` (the checkpoint just written) is never deleted. The caller allows
    only this run's own saves and checkpoints no newer than the one it resumed:
    an earlier run's newer checkpoints in the same folder are never touched.
    Symlinks are never candidates (``complete_checkpoints`` skips them).
    """
    if keep_latest_k <= 0:
        return []
    candidates = [path for step, path in complete_checkpoints(folder) if path != protect and deletable(step, path)]
    doomed = candidates[: max(0, len(candidates) - (keep_latest_k - 1))]
    for path in doomed:
        # Rename first so that a crash mid-delete never leaves a half folder named step-N.
        trash = path.with_name(f".old-{path.name}-{secrets.token_hex(4)}")
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


def ensure_folder(folder: Path) -> None:
    """Create the checkpoint folder, turning an OSError into a CheckpointError naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(
            f"cannot create the checkpoint folder {folder}: {exc}. Point --checkpoint.folder (relative to "
            f"job.run_dir) at a writable location."
        ) from exc
    import tempfile

    try:  # an existing folder that cannot be written would fail only at the first save, after training
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        what = describe_os_error(OSError(exc.errno, exc.strerror, str(folder)))
        raise CheckpointError(f"cannot save checkpoints into the checkpoint folder: {what}") from exc
