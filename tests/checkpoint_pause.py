"""Test-only fault injection: hold a checkpoint save after its files are written, before it is published.

Production code has no hook for this; the pause is put in from outside, by wrapping
``titan_core.checkpoint.integrity.digest_share`` (the manager digests the written
files just before it publishes the folder):

* in-process: ``install(at_step=2, pause_file=..., seconds=0.5)``;
* in a ``titan-train`` run (every rank of ``--nproc-per-node`` too):
  ``--import tests.checkpoint_pause`` with the repository on ``PYTHONPATH`` and
  ``TEST_PAUSE_SAVE_AT_STEP=k`` (optional ``TEST_PAUSE_FILE=path``, where each rank
  writes the temporary folder's path when it starts to sleep, and
  ``TEST_PAUSE_SECONDS=s``, default 60).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from titan_core.checkpoint import integrity, layout


def install(*, at_step: int, pause_file: Path | None = None, seconds: float = 60.0) -> None:
    original = integrity.digest_share
    prefix = f".tmp-{layout.step_dirname(at_step)}-"

    def digest_after_pause(folder: Path, **kwargs: Any) -> dict[str, tuple[int, int]]:
        if folder.name.startswith(prefix):
            if pause_file is not None:
                Path(pause_file).write_text(str(folder), encoding="utf-8")
            time.sleep(seconds)
        return original(folder, **kwargs)

    integrity.digest_share = digest_after_pause  # type: ignore[assignment]


if "TEST_PAUSE_SAVE_AT_STEP" in os.environ:
    install(
        at_step=int(os.environ["TEST_PAUSE_SAVE_AT_STEP"]),
        pause_file=Path(os.environ["TEST_PAUSE_FILE"]) if os.environ.get("TEST_PAUSE_FILE") else None,
        seconds=float(os.environ.get("TEST_PAUSE_SECONDS", "60")),
    )
