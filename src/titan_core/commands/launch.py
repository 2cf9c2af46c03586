"""``titan-train --nproc-per-node N``: re-launch this command as N local workers (see local_launcher)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.job import JobConfig

from ..runtime.local_launcher import launch


def _strip_nproc(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out


def relaunch(nproc: int, argv: list[str], *, config: JobConfig | None = None) -> int:
    """Run ``python -m titan_core <same args>`` as N workers; their exit code.

    The launcher holds the locks of the folders the run writes for its workers (taken before any starts).
    """
    from ..runtime.folder_locks import acquire_run_folders  # start-up: imports torch, unneeded by the launcher

    run_dir = Path(config.job.run_dir) if config is not None else None
    lock = acquire_run_folders(config) if config is not None else None
    try:
        return launch(nproc, _strip_nproc(argv), run_dir=run_dir)
    finally:
        if lock is not None:
            lock.release()
