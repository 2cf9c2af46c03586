"""Docs whose commands run as written: each ```bash block of a page, in order, in one empty folder.

Each block must exit 0 (or N where it says ``# exits N``), and every line of the output
copied in the ```text block under it that holds no number must appear in what the command
printed (numbers such as timings change from run to run).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


def run_blocks(pairs: list[tuple[str, str]], folder: Path, *,
               exact: bool | Callable[[str], bool] = False) -> None:
    """Run every block in ``folder`` with this interpreter's console scripts first on PATH (``titan-train`` a
    client of the suite's warm interpreter: conftest.warm_path). The lines the page copies under a block must
    be printed: those without digits (figures such as losses and times differ run to run), or, with ``exact``
    (output that is the same on every machine, such as a memory plan on meta), every one as written; ``exact``
    may instead pick the lines that are (a function of the line: step names, parameter counts, file names),
    digits included, leaving out those that vary (a metrics line)."""
    from conftest import warm_path

    path = [*warm_path(), str(Path(sys.executable).parent), os.environ["PATH"]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": os.pathsep.join(path)}
    for command, copied in pairs:
        proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=600)
        expected = int(match.group(1)) if (match := re.search(r"# exits (\d+)", command)) else 0
        output = proc.stdout + proc.stderr
        assert proc.returncode == expected, f"{command}\n{output}"
        for line in copied.splitlines():
            if line.strip() and (exact is True or not re.search(r"\d", line) or (callable(exact) and exact(line))):
                assert line in output, f"{line!r} not printed by:\n{command}\n{output}"


# --- every command of every page, for tests/test_docs_commands.py -------------------------------------------

# The programs whose lines count as documented commands; shell plumbing around them (ls, kill, grep, wait,
# loops) is not counted.
PROGRAMS = ("titan-train", "titan-eval", "titan-report", "titan-generate", "titan-data", "titan-convert",
            "titan-plugin", "titan-lm-eval", "lm_eval", "torchrun", "python", "pip", "bash", "srun", "tensorboard",
            "torchft_lighthouse")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    """One command line of a page: what a reader would type, with what the page says it prints."""

    page: str
    line: int  # 1-based line of the page where the command starts
    text: str  # continuation lines joined, comment dropped
    context: tuple[str, ...]  # the page's shell variable assignments above it (RUN=..., F="...")
    exit_code: int  # N where the page marks it "# exits N", 2 where it shows an "error:" line under it
    printed: tuple[str, ...]  # the lines a transcript shows under it ("..." ends a shortened line)
    block: int = 0  # which fenced block of the page holds it (0 = the first)
    script: str = ""  # a bash block's whole text (its shell glue too), which runs as one script; "" in a transcript
    copied: tuple[str, ...] = ()  # a bash block's output as the page copies it (the ```text block after it)

    @property
    def program(self) -> str:
        words = [w for w in self.text.split() if not _ASSIGNMENT.match(w)]
        return words[0] if words else ""


def _program_of(line: str) -> str:
    words = [w for w in line.split() if not _ASSIGNMENT.match(w)]
    return words[0] if words else ""


def documented_commands(page: str) -> list[DocCommand]:
    """Every command of ``docs/<page>``: the lines of its bash/sh/console blocks and the ``$ `` lines (or
    leading command lines) of its plain blocks, which are transcripts: the lines under a command there are
    what it printed."""
    text = (REPO / "docs" / page).read_text()
    found: list[DocCommand] = []
    context: list[str] = []
    fences = list(re.finditer(r"^([ \t]*)```(\w*)\n(.*?)^[ \t]*```", text, flags=re.S | re.M))
    for number, match in enumerate(fences):
        indent, lang, body = match.group(1), match.group(2), match.group(3)
        if lang not in ("bash", "sh", "shell", "console", ""):
            continue
        first_line = text.count("\n", 0, match.start(3)) + 1
        transcript = lang in ("console", "")
        lines = [line[len(indent):] if line.startswith(indent) else line for line in body.splitlines()]
        script = "" if transcript else "\n".join(lines)
        copied = () if transcript else _copied_output(fences[number + 1:])
        index = 0
        current: dict[str, object] | None = None
        while index < len(lines):
            start = index
            line = lines[index]
            while line.endswith("\\") and index + 1 < len(lines):  # a continued command
                index += 1
                line = line[:-1].rstrip() + " " + lines[index].strip()
            index += 1
            stripped = line.strip()
            prompted = stripped.startswith("$ ")
            if prompted:
                stripped = stripped[2:]
            command, comment = (re.split(r"(\s+#\s.*)$", stripped, maxsplit=1) + [""])[:2]
            command = command.strip()
            program = _program_of(command)
            is_command = (prompted or not transcript or current is None) and program in PROGRAMS
            if transcript and not prompted and current is not None and not is_command:
                if stripped:
                    current["printed"].append(stripped)  # type: ignore[union-attr]
                continue
            if current is not None:
                found.append(_finished(current))
                current = None
            if not command or command.startswith("#"):
                continue
            if not transcript and _only_assignments(command):
                context.append(command)
                continue
            if is_command:
                exits = re.search(r"exits (\d+)", comment)
                current = {"page": page, "line": first_line + start, "text": command, "context": tuple(context),
                           "exits": int(exits.group(1)) if exits else None, "printed": [], "block": number,
                           "script": script, "copied": copied}
                if not transcript:
                    found.append(_finished(current))
                    current = None
        if current is not None:
            found.append(_finished(current))
    return found


def _copied_output(later: list[re.Match[str]]) -> tuple[str, ...]:
    """The lines of the ```text block that follows a bash block, before any other command block."""
    for match in later:
        if match.group(2) == "text":
            return tuple(match.group(3).splitlines())
        if match.group(2) in ("bash", "sh", "shell", "console", ""):
            return ()
    return ()


def _only_assignments(command: str) -> bool:
    """``RUN=/tmp/x`` or ``F="--spec llama3 ..."``: a line that sets shell variables and runs nothing."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return bool(words) and all(_ASSIGNMENT.match(word) for word in words)


def _finished(fields: dict[str, object]) -> DocCommand:
    printed = tuple(fields["printed"])  # type: ignore[arg-type]
    shows_error = any(re.match(r"^[\w.-]+: error:|^error:", line) for line in printed)
    exits = fields["exits"]
    exit_code = exits if isinstance(exits, int) else 2 if shows_error else 0
    return DocCommand(page=str(fields["page"]), line=int(fields["line"]), text=str(fields["text"]),  # type: ignore[call-overload]
                      context=fields["context"], exit_code=exit_code, printed=printed,  # type: ignore[arg-type]
                      block=fields["block"], script=fields["script"], copied=fields["copied"])  # type: ignore[arg-type]
