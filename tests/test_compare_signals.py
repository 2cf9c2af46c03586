"""``titan-train --compare-baseline`` under SIGTERM and SIGINT: 143/130, one line, no traceback, no half output.

Real processes and real signals, as in tests/test_signals_and_hangs.py: SIGTERM while
the converted run trains stops it at the step boundary (a checkpoint saved, exit 143);
SIGINT while the baseline trains stops at once (exit 130). Neither leaves
compare.jsonl, compare.png or a temporary file of them behind.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from test_signals_and_hangs import assert_no_traceback, finish, start, wait_until_training

COMPARE = ("--compare-baseline", "--converters", "float8")


def compare_outputs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(("compare", ".compare")))


def test_sigterm_during_the_converted_run_saves_and_exits_143(tmp_path: Path) -> None:
    root, log = tmp_path / "run", tmp_path / "log.txt"
    proc = start(root, log, *COMPARE, "--checkpoint.enable=true", "--checkpoint.interval=1000")
    wait_until_training(proc, root / "converted", log)
    proc.send_signal(signal.SIGTERM)
    code, text, took = finish(proc, log)
    assert code == 143, text
    assert_no_traceback(text)
    stops = [line for line in text.splitlines() if "stopped by SIGTERM" in line]
    assert len(stops) == 1 and "checkpoint saved to" in stops[0], text
    step = int(stops[0].split("after step ")[1].split(";")[0])
    assert (root / "converted" / "checkpoints" / f"step-{step:06d}" / "titan_checkpoint.json").is_file()
    assert not (root / "baseline").exists()  # the second run never started
    assert compare_outputs(root) == []
    assert took < 30, took


def test_sigint_during_the_baseline_run_exits_130_without_output(tmp_path: Path) -> None:
    root, log = tmp_path / "run", tmp_path / "log.txt"
    proc = start(root, log, *COMPARE, "--training.steps=8")
    wait_until_training(proc, root / "baseline", log)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code, text, took = finish(proc, log)
    assert code == 130, text
    assert_no_traceback(text)
    assert text.count("interrupted (SIGINT)") == 1, text
    assert compare_outputs(root) == []
    assert time.monotonic() - t0 < 30


def test_a_sigterm_after_both_runs_writes_no_comparison(monkeypatch, tmp_path: Path) -> None:
    """The window between the last step and the output: the stop is still honoured (unit, no training)."""
    import pytest

    from titan_core.commands.compare import stop_if_requested
    from titan_core.errors import StopRequested
    from titan_core.runtime import signals

    with signals.handlers_installed():
        stop_if_requested(2)  # nothing pending: returns
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(StopRequested) as stop:
            stop_if_requested(2)
    assert stop.value.exit_code == 143
    assert "stopped by SIGTERM after 2 of 2 runs; the comparison files were not written" in str(stop.value)
