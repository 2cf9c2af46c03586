"""Docs whose commands run as written: each ```bash block of a page, in order, in one empty folder.

Each block must exit 0 (or 2 where it says ``# exits 2``), and every line of the output
copied in the ```text block under it that holds no number must appear in what the command
printed (numbers such as timings change from run to run).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def blocks(page: str) -> list[tuple[str, str]]:
    """(bash command, copied output) pairs of ``docs/<page>``, in document order."""
    text = (REPO / "docs" / page).read_text()
    found = re.findall(r"```(bash|text)\n(.*?)```", text, flags=re.S)
    pairs: list[tuple[str, str]] = []
    for kind, body in found:
        if kind == "bash":
            pairs.append((body, ""))
        elif pairs and not pairs[-1][1]:
            pairs[-1] = (pairs[-1][0], body)
    return pairs


def run_blocks(pairs: list[tuple[str, str]], folder: Path) -> None:
    """Run every block in ``folder`` with this interpreter's console scripts first on PATH."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command, copied in pairs:
        proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=600)
        expected = 2 if "# exits 2" in command else 0
        output = proc.stdout + proc.stderr
        assert proc.returncode == expected, f"{command}\n{output}"
        for line in copied.splitlines():
            if line.strip() and not re.search(r"\d", line):
                assert line in output, f"{line!r} not printed by:\n{command}\n{output}"
