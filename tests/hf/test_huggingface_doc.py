"""docs/huggingface.md is true: its commands run as written, in order, in an empty folder.

Each bash block must exit 0 (or 2 where it says ``# exits 2``), and every line of the
output copied under it that holds no number must appear in what the command printed
(numbers such as timings change from run to run).
"""

from __future__ import annotations

from pathlib import Path

from doc_commands import blocks, run_blocks


def test_every_command_runs_as_written(tmp_path: Path) -> None:
    pairs = blocks("huggingface.md")
    assert len(pairs) >= 6
    run_blocks(pairs, tmp_path)
