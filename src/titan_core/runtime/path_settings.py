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

__all__ = ["forget_paths", "kept_after_failure", "remember_paths", "remember_tool_paths", "setting_for", "unnamed_file_setting"]

_PATHS: list[tuple[str, str]] = []  # (absolute path, setting name, or a tool's flag as typed: "--out")
_UNNAMED: list[tuple[str, str]] = []  # (folder, setting) an error naming no file is about, when a tool has one
# What a full disk leaves whole: a training run's published checkpoints; a console tool says its own.
_RUN_KEEPS = "Checkpoints published before this are intact."
_KEPT: list[str] = [_RUN_KEEPS]


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
    _UNNAMED.clear()
    _KEPT[:] = [_RUN_KEEPS]


def forget_paths() -> None:
    """No path is any setting's (a tool starts: an earlier command's settings in this process are not its flags)."""
    _PATHS.clear()
    _UNNAMED.clear()
    _KEPT[:] = [""]


def remember_tool_paths(flags: list[tuple[str, Path]], *, unnamed: str | None = None, kept: str = "") -> None:
    """A console tool's own path flags, as typed (``[("--out", Path(...))]``, or a positional's name, ``OUT``;
    a flag may own several paths); ``unnamed``: the flag whose first path an OS error that names no file is about
    (a tool that writes only there); ``kept``: what a full disk leaves whole."""
    _PATHS[:] = [(os.path.abspath(path), flag) for flag, path in flags]
    _UNNAMED[:] = [(os.path.abspath(path), flag) for flag, path in flags if flag == unnamed][:1]
    _KEPT[:] = [kept]


def kept_after_failure() -> str:
    """The sentence that says what a failed write left whole ("" when the command has none to say)."""
    return _KEPT[0]


def unnamed_file_setting() -> tuple[str, str] | None:
    """(folder, flag) for an OS error that names no file, when the running tool writes only under one flag."""
    return _UNNAMED[0] if _UNNAMED else None


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
