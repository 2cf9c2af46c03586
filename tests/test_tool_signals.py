"""titan-plugin and titan-convert on Ctrl+C, SIGTERM and an unusable path: one line, the documented exit
code (130, 143, 2), no traceback, and no training run left behind by `titan-plugin check`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, alive, descendants


@pytest.mark.parametrize(("signum", "code", "line"), [
    (signal.SIGINT, 130, "titan-plugin: interrupted (SIGINT); no results"),
    (signal.SIGTERM, 143, "titan-plugin: stopped by SIGTERM; no results"),
])
def test_a_signal_stops_plugin_check_with_one_line_and_its_training_run(signum: int, code: int, line: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "titan_core.commands.titan_plugin", "check", "float8"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (runs := descendants(proc.pid)):  # wait until a check is training in a child process
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # a terminal's Ctrl+C reaches the whole foreground group
        else:
            os.kill(proc.pid, signum)  # a scheduler's SIGTERM to the tool alone
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, out + err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == line, err
    time.sleep(0.5)
    assert not [pid for pid in runs if alive(pid)], "a training run of the check outlived it"


def test_plugin_new_into_an_unusable_folder_is_one_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "titan_core.commands.titan_plugin", "new", "converter", "xx", "--dir",
                           str(blocker / "pkg")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    # the message names the path component in the way (the file), not the folder asked for
    assert proc.stderr.startswith(f"titan-plugin: error: cannot use {blocker}: it already exists and is not a folder"), \
        proc.stderr
    assert blocker.read_text() == "x"
