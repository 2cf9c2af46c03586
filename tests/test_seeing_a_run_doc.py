"""docs/seeing-a-run.md is true: its commands (train, report, compare, generate, convert, a bad
input) run as written, in order, in an empty folder; the files they name are there after."""

from __future__ import annotations

from pathlib import Path

from doc_commands import blocks, run_blocks


def test_every_command_runs_as_written(tmp_path: Path) -> None:
    pairs = blocks("seeing-a-run.md")
    assert len(pairs) >= 7
    run_blocks(pairs, tmp_path, exact=True)  # step names, token counts, a refusal's value: the same on every run
    for name in ("runs/small/report.html", "runs/small/report-loss.png", "compare.html", "compare-loss.png",
                 "hf-small/config.json"):
        assert (tmp_path / name).is_file(), name
    assert "runs/small-lr" in (tmp_path / "compare.html").read_text()
