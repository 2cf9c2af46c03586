"""An argparse help formatter that finds the terminal's width without importing ``shutil``.

argparse's own formatter imports ``shutil`` (and with it zlib, bz2 and lzma) only to read the
terminal's width: about 3 ms of start-up on every run of a command, help or not. ``titan-data
prepare`` is measured against the bare tokenizer's start-up (docs/benchmarks.md), so it reads the
width the same way ``shutil.get_terminal_size`` does, with ``os`` alone.
"""

from __future__ import annotations

import argparse
import os
import sys


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: ``$COLUMNS`` when it is a positive number, else the width of
    the terminal on standard output, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, given the width argparse would compute (the terminal's, less 2)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         terminal_columns() - 2 if width is None else width)
