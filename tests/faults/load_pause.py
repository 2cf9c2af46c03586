"""Test-only fault injection: hold a checkpoint *load* (a resume) before it reads any tensor.

Loaded with ``--import tests.faults.load_pause`` (the repository on ``PYTHONPATH``). Each rank
writes ``$TEST_LOAD_PAUSE_FILE.<rank>`` when it starts to wait, then sleeps
``TEST_LOAD_PAUSE_SECONDS`` (default 60) before the real load, so a test can send a signal
while every rank is inside the resume.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from titan_core.checkpoint.manager import CheckpointManager

_real_load = CheckpointManager._load


def _load_after_pause(self: CheckpointManager, path: Path, index: Any, *, weights_only: bool) -> Any:
    marker = os.environ.get("TEST_LOAD_PAUSE_FILE")
    if marker:
        Path(f"{marker}.{os.environ.get('RANK', '0')}").write_text(str(path), encoding="utf-8")
    time.sleep(float(os.environ.get("TEST_LOAD_PAUSE_SECONDS", "60")))
    return _real_load(self, path, index, weights_only=weights_only)


CheckpointManager._load = _load_after_pause  # type: ignore[method-assign]
