"""``titan-train --nproc-per-node N``: re-launch this command as N local workers (see local_launcher)."""

from __future__ import annotations

from pathlib import Path

from ..local_launcher import launch
from ..run_lock import acquire_run_lock


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


def relaunch(nproc: int, argv: list[str], *, run_dir: Path | None = None) -> int:
    """Run ``python -m titan_core <same args>`` as N workers; their exit code.

    The launcher holds the run folder's lock for its workers (taken before any starts).
    """
    lock = acquire_run_lock(run_dir) if run_dir is not None else None
    try:
        return launch(nproc, _strip_nproc(argv), run_dir=run_dir)
    finally:
        if lock is not None:
            lock.release()
