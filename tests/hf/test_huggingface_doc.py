"""docs/huggingface.md is true: its commands run as written, in order, in an empty folder.

Each bash block must exit 0 (or 2 where it says ``# exits 2``), and every line of the
output copied under it that holds no number must appear in what the command printed
(numbers such as timings change from run to run).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def blocks() -> list[tuple[str, str]]:
    """(bash command, copied output) pairs, in document order."""
    text = (REPO / "docs" / "huggingface.md").read_text()
    found = re.findall(r"```(bash|text)\n(.*?)```", text, flags=re.S)
    pairs: list[tuple[str, str]] = []
    for kind, body in found:
        if kind == "bash":
            pairs.append((body, ""))
        elif pairs and not pairs[-1][1]:
            pairs[-1] = (pairs[-1][0], body)
    return pairs


def test_every_command_runs_as_written(tmp_path: Path) -> None:
    pairs = blocks()
    assert len(pairs) >= 6
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command, copied in pairs:
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        expected = 2 if "# exits 2" in command else 0
        output = proc.stdout + proc.stderr
        assert proc.returncode == expected, f"{command}\n{output}"
        for line in copied.splitlines():
            if line.strip() and not re.search(r"\d", line):
                assert line in output, f"{line!r} not printed by:\n{command}\n{output}"
