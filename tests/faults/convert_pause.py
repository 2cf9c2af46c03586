"""Test-only fault injection: hold ``titan-convert`` after it wrote every file of OUT, before it publishes OUT.

Production code has no hook for this; run titan-convert as
``python -c "import tests.faults.convert_pause, sys; from titan_core.commands.convert import main;
sys.exit(main())" to-hf ...`` with the repository on ``PYTHONPATH``. It writes
``$TEST_CONVERT_PAUSE_FILE`` (the partial folder's path) when it starts to wait, then sleeps
``TEST_CONVERT_PAUSE_SECONDS`` (default 60) before the real publish, so a test can kill it there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from titan_core.runtime import folder_publish

_real_publish = folder_publish.publish


def _publish_after_pause(partial: Path, final: Path) -> None:
    marker = os.environ.get("TEST_CONVERT_PAUSE_FILE")
    if marker:
        Path(marker).write_text(str(partial), encoding="utf-8")
    time.sleep(float(os.environ.get("TEST_CONVERT_PAUSE_SECONDS", "60")))
    _real_publish(partial, final)


folder_publish.publish = _publish_after_pause  # type: ignore[assignment]
