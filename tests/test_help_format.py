"""The help formatter of ``titan-data`` reads the terminal's width as argparse's own does, without shutil."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from titan_core.commands.data_prepare import build_parser
from titan_core.commands.help_format import HelpFormatter, terminal_columns

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("columns", ["57", "200", "abc", "0", "-3", ""])
def test_width_is_what_shutil_gives(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns


def test_width_without_columns_is_what_shutil_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal_columns() == shutil.get_terminal_size().columns


def _prepare(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``prepare`` sub-command's parser."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices["prepare"]
    return found


@pytest.mark.parametrize("columns", ["40", "100"])
def test_help_text_is_argparse_own(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    ours = build_parser()
    theirs = build_parser()
    for parser in (theirs, _prepare(theirs)):
        parser.formatter_class = argparse.HelpFormatter
    assert ours.format_help() == theirs.format_help()
    prepare_ours, prepare_theirs = _prepare(ours), _prepare(theirs)
    assert ours.formatter_class is HelpFormatter and prepare_ours.formatter_class is HelpFormatter
    assert prepare_ours.format_help() == prepare_theirs.format_help()


def test_help_follows_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = build_parser().format_help()
    monkeypatch.setenv("COLUMNS", "120")
    wide = build_parser().format_help()
    assert len(narrow.splitlines()) > len(wide.splitlines())


def test_prepare_start_up_imports_neither_shutil_nor_lzma(tmp_path: Path) -> None:
    """What prepare of a small file imports beyond the tokenizer's own needs stays out (issue 35's start-up bar)."""
    small = tmp_path / "small.jsonl"
    small.write_text('{"text": "a small document"}\n')
    command = [sys.executable, "-X", "importtime", "-m", "titan_core.commands.data_prepare", "prepare", str(small),
               "--tokenizer", "builtin", "--out", str(tmp_path / "out"), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "titan_core.data.prepare.pipeline" in imported and "tiktoken" in imported
    assert imported.isdisjoint({"shutil", "lzma", "bz2", "dataclasses", "titan_core.plugin_api", "torch"})
    assert (tmp_path / "out" / "index.json").is_file()
