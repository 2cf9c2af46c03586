"""The one harness of the hostile-input suites (test_hostile_inputs, test_hostile_checkpoints, test_hostile_survey).

Each case runs a command (in a fresh process or the CLI's ``main`` in this one) against a copy of a
good run folder and asserts the project's rule for bad input: the documented exit code, one
``error:`` line holding the expected fragment, no traceback, and no file that existed before
changed on disk. ``pytest -s`` prints each suite's table of (case, exit code, message).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import CliResult, run_main

# The good run every case starts from finished 4 steps with checkpoints at steps 2 and 4.
LAST = "checkpoints/step-000004"
Snapshot = dict[str, tuple[int, int, str]]
Table = list[tuple[str, int, str]]
# Launcher variables a case may set; none may leak in from the shell that runs pytest.
LAUNCHER_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "LOCAL_WORLD_SIZE", "TITAN_DISABLE_PLUGINS")


def small(*, n_layers: int = 2, batch: int = 4, warmup: int = 2) -> tuple[str, ...]:
    """A llama3 debugmodel run small enough for a case, checkpointing every 2 steps."""
    return ("--spec", "llama3", "--flavor", "debugmodel", f"--llama3.n_layers={n_layers}", "--training.seq_len=32",
            f"--training.local_batch_size={batch}", "--metrics.log_freq=1", f"--lr_scheduler.warmup_steps={warmup}",
            "--checkpoint.enable=true", "--checkpoint.interval=2", "--checkpoint.keep_latest_k=0")


def snapshot(folder: Path) -> Snapshot:
    """path -> (size, mtime_ns, sha1) of every file under ``folder``; a link is recorded by its target, not followed."""
    out: Snapshot = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            out[name] = (0, 0, f"-> {os.readlink(path)}")
        elif path.is_file():
            stat = path.stat()
            out[name] = (stat.st_size, stat.st_mtime_ns, hashlib.sha1(path.read_bytes()).hexdigest())
    return out


@dataclass(frozen=True)
class HostileCase:
    """One hostile input run through the CLI's ``main`` in this process (the survey's cases, and the
    hostile-input suite's second survey, which adds its own fields)."""

    id: str
    args: tuple[str, ...]  # "{run}", "{inputs}", "{fresh}" are filled in
    fragment: str
    code: int = 2
    env: tuple[tuple[str, str], ...] = ()
    damage: Callable[[Path], None] | None = None
    small: bool = True


def damaged_copy(good_run: Path, tmp_path: Path, damage: Callable[[Path], None] | None) -> Path:
    """A copy of the good run folder for one case (``tmp_path``/run), with the case's damage done to it."""
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    if damage is not None:
        damage(run)
    return run


def error_lines(result: CliResult) -> list[str]:
    return [line for line in result.err.splitlines() if "error:" in line]


def first_error_line(result: CliResult) -> str:
    """The error line; a heading ending in ':' (e.g. "invalid configuration:") with its first detail."""
    lines = [line.strip() for line in result.text.splitlines()]
    for i, line in enumerate(lines):
        if "error:" in line:
            return f"{line} {lines[i + 1]}" if line.endswith(":") and i + 1 < len(lines) else line
    return lines[0] if lines else ""


def assert_one_clean_error(result: CliResult, fragment: str, code: int = 2) -> None:
    """Exit ``code``, ``fragment`` in the output, no traceback, exactly one error line (not a cascade)."""
    assert result.code == code, result.text
    assert fragment in result.text, f"{fragment!r} not in:\n{result.text}"
    assert "Traceback" not in result.text, result.text
    assert len(error_lines(result)) == 1, result.text


def assert_unchanged(before: Snapshot, folder: Path, *, allowed: Iterable[str] = ()) -> None:
    """No file of ``before`` changed or vanished under ``folder`` (``allowed`` names may)."""
    after = snapshot(folder)
    changed = {name: (before[name], after.get(name)) for name in before
               if after.get(name) != before[name] and name not in set(allowed)}
    assert not changed, changed


@contextlib.contextmanager
def signals_restored() -> Iterator[None]:
    """The CLI installs its own SIGINT/SIGTERM handlers: put pytest's back after each in-process run."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def isolate(monkeypatch: pytest.MonkeyPatch, env: Iterable[tuple[str, str]] = ()) -> None:
    """The tests folder importable (``--import _hostile_plugins``), and of the launcher's variables only ``env``."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env:
        monkeypatch.setenv(name, value)


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    """The CLI's ``main`` here (same code path, no interpreter start-up), signal handlers restored afterwards."""
    with signals_restored():
        return run_main(capsys, *args)


def tool(capsys: pytest.CaptureFixture[str], main: Callable[[list[str]], int], *args: str) -> CliResult:
    """A one-shot tool's ``main`` (titan-generate, titan-report, titan-data, ...) in this process, with its output."""
    with signals_restored():
        code = main(list(args))
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


class Hung(Exception):
    """A case ran past its alarm's seconds: the command waited on something that never came."""


def alarm_guard(seconds: int) -> Callable[[], Iterator[None]]:
    """An autouse fixture: SIGALRM after ``seconds`` fails the test with Hung instead of holding the suite (a
    blocked open() of a FIFO is interrupted too: PEP 475 lets the handler's exception through)."""

    @pytest.fixture(autouse=True)
    def no_hang() -> Iterator[None]:
        def hung(signum: int, frame: object) -> None:
            raise Hung(f"no answer within {seconds} s: it hangs")

        previous = signal.signal(signal.SIGALRM, hung)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    return no_hang


def table_printer(table: Table, heading: str) -> Callable[[], Iterator[None]]:
    """A module fixture that prints ``table`` (case, exit code, first error line) after the module's tests."""

    @pytest.fixture(scope="module", autouse=True)
    def print_at_end() -> Iterator[None]:
        yield
        print_table(table, heading)

    return print_at_end


def print_table(table: Table, heading: str) -> None:
    width = max((len(name) for name, _, _ in table), default=10)
    print(f"\n\n| {heading} | exit code | message (first line) |\n|---|---|---|")
    for name, code, message in table:
        print(f"| {name:<{width}} | {code} | {message.replace('|', '/')[:200]} |")
