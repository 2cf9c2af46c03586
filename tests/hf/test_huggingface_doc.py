"""docs/huggingface.md is true: its commands run as written, in order, in an empty folder.

Each bash block must exit 0 (or 2 where it says ``# exits 2``), and every line of the
output copied under it that holds no number must appear in what the command printed
(numbers such as timings change from run to run); the lines whose numbers are the same on every run
(file names, the model's shape and parameter count, what a rank read, the prompt's token ids, step names)
are checked to the digit.
"""

from __future__ import annotations

import re
from pathlib import Path

from doc_commands import blocks, run_blocks


def test_every_command_runs_as_written(tmp_path: Path) -> None:
    pairs = blocks("huggingface.md")
    assert len(pairs) >= 6
    run_blocks(pairs, tmp_path, exact=same_on_every_run)


def same_on_every_run(line: str) -> bool:
    """Not a metrics line, the run's closing summary (losses) or the greedy tokens of a randomly made model."""
    return not re.match(r"step +\d+ \||\[titan\] done:|generated ids:", line)
