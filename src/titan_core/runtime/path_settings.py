"""Which setting a path came from, so an error about a file names the knob that chose it.

``cannot use runs/x/checkpoints: permission denied`` leaves a user to work out which of
several path settings produced that folder; ``(from checkpoint.folder)`` does not. The CLI
records the run's path settings once the config is resolved; :func:`setting_for` finds the
one whose path is the longest prefix of a failing file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.job import JobConfig

__all__ = ["remember_paths", "setting_for"]

_PATHS: list[tuple[str, str]] = []  # (absolute path, setting name)


def remember_paths(config: JobConfig) -> None:
    """Record the path settings of a resolved JobConfig (relative ones resolved as the run resolves them)."""
    run_dir = Path(config.job.run_dir)
    found = [(run_dir, "job.run_dir"), (run_dir / config.checkpoint.folder, "checkpoint.folder"),
             (run_dir / config.profiling.folder, "profiling.folder")]
    for name, value in (("data.source", config.data.source), ("data.tokenizer", config.data.tokenizer),
                        ("checkpoint.initial_load", config.checkpoint.initial_load)):
        if value and value != "builtin" and not value.startswith("hf:"):
            found.append((Path(value), name))
    _PATHS[:] = [(os.path.abspath(path), name) for path, name in found]


def setting_for(filename: str | bytes | os.PathLike[Any]) -> str | None:
    """The setting whose path is ``filename`` or holds it (the longest such path), or None."""
    try:
        path = os.path.abspath(os.fsdecode(filename))
    except (TypeError, ValueError):  # an OSError's filename can be anything a library put there
        return None
    best: tuple[int, str] | None = None
    for root, name in _PATHS:
        if (path == root or path.startswith(root.rstrip(os.sep) + os.sep)) and (best is None or len(root) > best[0]):
            best = (len(root), name)
    return best[1] if best else None
