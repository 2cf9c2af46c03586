"""No wait without a deadline (issue 31, item 1): each case is a real process that never answers.

* plugin calls in ``titan-plugin check --fast``: a converter's optimizer hook, a model's forward, a
  spec's ``parallelize_fn`` that never return fail their check as ``timed out``, naming the call, and
  the checks after them are not run (``convert()`` is covered in test_hardening_second_pass.py);
* hub reads in ``titan-data prepare``: an ``hf:`` source behind a server process on 127.0.0.1 that
  accepts connections and never answers stops at ``--hf-timeout`` with one message naming it
  (``titan-train``'s ``data.hf_timeout_s`` is covered in test_hardening_second_pass.py).
The supervisor's waits are in test_process_trees.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO

ENV = {**{k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")},
       "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}

SILENT_SERVER = """
import socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(64)
print(server.getsockname()[1], flush=True)
held = []
while True:
    held.append(server.accept()[0])  # accepted, never read from, never answered
"""


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A process listening on 127.0.0.1 that accepts every connection and never answers."""
    proc = subprocess.Popen([sys.executable, "-c", SILENT_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def test_titan_data_prepare_from_a_hub_that_never_answers_stops_at_its_deadline(silent_server: int,
                                                                                 tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{silent_server}"
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "titan_core.commands.data_prepare", "prepare", "hf:someone/corpus",
                           "--tokenizer", "builtin", "--out", str(out), "--allow-download", "--hf-timeout", "3",
                           "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**ENV, "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0",
                               "HF_HOME": str(tmp_path / "hf-home")})
    seconds = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert 'data.source "hf:someone/corpus": no data for 3 s (--hf-timeout) before the first row arrived' in text, text
    assert url in text and "Traceback" not in text, text
    assert seconds < 60, seconds


@pytest.mark.parametrize("name, check, call", [
    ("hang_hook", "hooks once per step", "pre_optimizer_hook"),
    ("hang_forward", "FLOPs/token vs matmuls", "the model's forward"),
    ("hang_parallelize", "loss falls over 30 steps", "parallelize_fn"),
])
def test_a_plugin_call_that_never_returns_fails_its_check(name: str, check: str, call: str) -> None:
    # The deadline is waited out in full once or twice per case: short, yet far above what one legitimate
    # call of these tiny models takes (a meta convert, one forward, one hook: under a second on a busy machine).
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "titan_core.commands.titan_plugin", "check", name, "--fast",
                           "--call-timeout", "6", "--import", "_wait_plugins"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=400)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    row = next(line for line in proc.stdout.splitlines() if line.startswith(check))
    assert "FAIL" in row, row
    assert f"did not return from {call} within 6 s" in text, text
    assert "Traceback" not in text, text
    assert time.monotonic() - t0 < 300
