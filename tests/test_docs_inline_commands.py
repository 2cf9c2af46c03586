"""Commands the docs/ pages name in their prose (``titan-train --schema`` in a sentence) work as written too.

tests/test_docs_commands.py runs the pages' code blocks; this test takes every backticked span of a page's prose
that starts with one of the project's programs (the plugin guides' spans are run by tests/test_wheels.py) and
accounts for each, with the count printed (pytest -s) and checked:

- **a name** (``titan-convert to-hf``), **a pattern** (``titan-eval CHECKPOINT --tasks ...``) or **printed output**
  (``titan-train: error: ...``): nothing to run;
- **run here**, in the README's environment (every spec installed, no default spec), from a folder holding what
  a clone holds (README.md, tests, examples) plus any file the page shows (``# mypkg/configs.py``):
  for real (``titan-train`` in a fresh fork of the suite's warm interpreter, tests/warm_start.py); a command the
  page shows failing must exit with its code and print its words (``INLINE_EXPECTED``);
- **not run here**, each with its reason (``INLINE_NOT_RUN``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs_commands import SUITE_ONLY_ENV, page_folder

from conftest import REPO, warm_path

PROGRAMS = r"titan-(?:train|plugin|convert|data|eval|report|generate|lm-eval)|torchrun"
INLINE = re.compile(rf"`((?:[A-Z_]+=\S+ )*(?:{PROGRAMS})\b[^`]*)`")
GUIDES = ("writing-a-converter.md", "writing-a-train-spec.md")  # tests/test_wheels.py runs theirs
SUBCOMMANDS = {"to-hf", "from-hf", "check", "new", "prepare"}
PAGES = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name not in GUIDES)

WAIT_DEMO = ("WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 titan-train --spec llama3 "
             "--parallelism.init_timeout_s=8")
#: Commands a page shows failing: (exit code, what it prints).
INLINE_EXPECTED = {
    "titan-train --spec llama3 --job.run_dir=README.md/run": (2, ("cannot use README.md/run: a path component is a "
                                                                  "file, not a folder",)),
    WAIT_DEMO: (2, ("is waiting for the other 1 process(es) of WORLD_SIZE=2 to connect at 127.0.0.1:29555",
                    "rendezvous gave up after 8 s (parallelism.init_timeout_s)")),
}
#: (page, command): why it does not run here.
INLINE_NOT_RUN = {
    ("benchmarks.md", "titan-generate --device cuda"): "needs a CUDA device (the GPU checks run it: scripts/gpu)",
    ("fault-tolerance.md", "titan-report runs/ft-demo"): "reads the folder of the page's local demo, a 60-step "
    "run of three groups with a kill (tests/test_ft_report_units.py and test_fault_tolerance.py report such runs)",
    ("plugins.md", "titan-train --import mypkg.mymodule"): "names the reader's own module",
}


def inline_commands(page: str) -> list[str]:
    """The backticked command spans of the page's prose (outside code blocks), joined onto one line, in order."""
    prose = re.sub(r"```.*?```", "", (REPO / "docs" / page).read_text(), flags=re.S)
    seen: dict[str, None] = {}
    for span in INLINE.findall(prose):
        seen.setdefault(" ".join(span.split()), None)
    return list(seen)


def kind(command: str) -> str:
    """"name", "pattern", "output" or "command"."""
    words = command.split()
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words = words[1:]
    program, rest = words[0], words[1:]
    if program.endswith(":") or " (pid " in command:
        return "output"
    if all(word in SUBCOMMANDS for word in rest):
        return "name"
    placeholder = re.compile(r"[A-Z][A-Z0-9_]*(?::[A-Z]+)?")
    if any(mark in command for mark in ("...", "<", "[")) or any(
            placeholder.fullmatch(word.split("=", 1)[-1]) for word in rest):
        return "pattern"
    return "command"


def page_files(page: str, folder: Path) -> None:
    """The files a page shows in Python blocks under a ``# path`` first line, written where it says."""
    text = (REPO / "docs" / page).read_text()
    for body in re.findall(r"```python\n# ([\w/.-]+\.py)\n(.*?)```", text, flags=re.S):
        path, code = body
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(code)


def test_every_inline_command_of_every_docs_page_is_run_or_accounted_for(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in SUITE_ONLY_ENV}
    env.update(OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([*warm_path(), str(Path(sys.executable).parent), os.environ["PATH"]]))

    counts = {"name": 0, "pattern": 0, "output": 0, "run": 0, "not run": 0}
    failed: list[str] = []
    listed: set[tuple[str, str]] = set()
    for page in PAGES:
        folder = page_folder(tmp_path, page)
        page_files(page, folder)
        for command in inline_commands(page):
            what = kind(command)
            if what != "command":
                counts[what] += 1
                continue
            if (page, command) in INLINE_NOT_RUN:
                counts["not run"] += 1
                listed.add((page, command))
                continue
            counts["run"] += 1
            proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=300)
            output = proc.stdout + proc.stderr
            code, words = INLINE_EXPECTED.get(command, (0, ()))
            if proc.returncode != code or not all(word in output for word in words):
                failed.append(f"docs/{page}: `{command}`: exit {proc.returncode} (expected {code}, printing "
                              f"{words}):\n  {output[-800:]}")
            elif "Traceback (most recent call last)" in output:
                failed.append(f"docs/{page}: `{command}` printed a traceback:\n  {output[-800:]}")

    with capsys.disabled():
        print(f"\ndocs inline commands: {sum(counts.values())} in {len(PAGES)} pages: {counts['run']} run here for real, "
              f"{counts['not run']} not run here, {counts['name']} names, {counts['pattern']} patterns, "
              f"{counts['output']} quoted outputs; {len(failed)} failed")
    assert not failed, "\n\n".join(failed)
    assert listed == set(INLINE_NOT_RUN), f"no longer on its page: {set(INLINE_NOT_RUN) - listed}"
    assert counts["run"] >= 8, counts
