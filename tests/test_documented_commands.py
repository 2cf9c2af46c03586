"""Every command the README's bash blocks and ``titan-train --help`` show runs as written in the README's own
environment (every spec of this repository installed, as after scripts/setup.sh), issue 31 item 5.

Every command runs for real. Training commands train: those that would train longer than
``STEP_CAP`` steps (the README's lines train the default 200) get ``--training.steps=2`` appended, the one
change made to what the reader types, so that the suite's time stays bounded; the count says how many.
``torchrun --nproc-per-node N -m titan_core ARGS`` starts its N workers (on a free port, ``PET_MASTER_PORT``,
torchrun's own environment form of ``--master-port``). ``titan-train`` runs in a fresh fork of the suite's warm
interpreter (tests/warm_start.py: the imports are paid once). ``titan-report`` and ``titan-generate`` read two
2-step runs made first; ``pip install PATHS`` is checked to name this repository's projects (the install
itself is what scripts/setup.sh does before every test). The top block (scripts/quickstart.sh and
scripts/test.sh), like any other ``bash scripts/...`` line (an environment and the whole suite), is run by
tests/test_readme.py and by CI. The count is printed (pytest -s shows it) and checked, so a command added to
the docs is a command run here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, free_port, warm_path

BIN = Path(sys.executable).parent
TINY_RUN = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
            "--training.local_batch_size=2", "--training.steps=2", "--checkpoint.enable=true", "--metrics.report=false")


def readme_commands() -> list[str]:
    """The command lines of the README's bash blocks after the first (comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    lines = []
    for block in blocks[1:]:  # the first: quickstart.sh and test.sh (tests/test_readme.py, CI)
        for line in block.splitlines():
            command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            # `bash scripts/...` lines set up an environment and run the whole suite (scripts/setup.sh,
            # test.sh, setup_torch211.sh): CI runs them, not a test inside the suite.
            if command and not command.startswith(("#", "bash scripts/")):
                lines.append(command)
    return lines


def help_commands() -> list[str]:
    text = subprocess.run([str(BIN / "titan-train"), "--help"], capture_output=True, text=True, check=True).stdout
    examples = text.split("examples:", 1)[1]
    return [line.strip() for line in examples.splitlines() if line.strip().startswith(("titan-", "torchrun "))]


#: The most steps a documented training command trains here; a longer one gets ``--training.steps=STEP_CAP``.
STEP_CAP = 2
_STOPS_BEFORE_TRAINING = {"--dry-run", "--list", "--schema", "--print-config", "--help"}


def as_run(command: str) -> tuple[str, bool] | None:
    """The shell command to run for a documented one, and whether its step count was capped; None for ``pip
    install``."""
    words = shlex.split(command.split(">")[0])
    if words[0] == "pip":
        return None
    trains = words[0] in ("titan-train", "torchrun") and not _STOPS_BEFORE_TRAINING & set(words)
    steps = [int(w.split("=", 1)[1]) for w in words if w.startswith("--training.steps=")]
    if trains and (not steps or steps[-1] > STEP_CAP):
        return f"{command} --training.steps={STEP_CAP}", True  # a flag given twice: the last one counts
    return command, False


def test_every_documented_command_runs_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands = readme_commands() + help_commands()
    # As the reader's shell has it: without the suite's default spec (conftest.py), with every spec installed.
    suite_only = ("TITAN_DEFAULT_SPEC", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")
    env = {**{k: v for k, v in os.environ.items() if k not in suite_only},
           "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    # titan-train: a fresh fork of the suite's warm interpreter per command (conftest.warm_path)
    run_commands(commands, tmp_path, {**env, "PATH": os.pathsep.join([*warm_path(), env["PATH"]])}, capsys)


def run_commands(commands: list[str], tmp_path: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a", "b"):  # what titan-report and titan-generate read
        made = subprocess.run([str(BIN / "titan-train"), *TINY_RUN, f"--job.run_dir=runs/{name}"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        assert made.returncode == 0, made.stderr
    ran, capped, checked, failed = 0, 0, 0, []
    for command in commands:
        plan = as_run(command)
        if plan is None:  # pip install: every path it names is one of this repository's projects
            paths = [w for w in shlex.split(command)[2:] if not w.startswith("-")]
            assert paths and all((REPO / p / "pyproject.toml").is_file() for p in paths), command
            checked += 1
            continue
        shell, was_capped = plan
        proc = subprocess.run(["bash", "-c", shell], cwd=tmp_path, env={**env, "PET_MASTER_PORT": str(free_port())},
                              capture_output=True, text=True, timeout=600)
        ran += 1
        capped += was_capped
        output = proc.stdout + proc.stderr
        if proc.returncode != 0:
            failed.append(f"{command}\n  ran: {shell}\n  exit {proc.returncode}: {output[-1200:]}")
        elif "Traceback (most recent call last)" in output:
            failed.append(f"{command}\n  ran: {shell}\n  printed a traceback: {output[-1200:]}")
        elif was_capped and f"done: {STEP_CAP} steps this run" not in output:
            failed.append(f"{command}\n  ran: {shell}\n  did not train {STEP_CAP} steps: {output[-1200:]}")
    with capsys.disabled():
        print(f"\ndocumented commands: {len(commands)} ({ran} run for real, {capped} of them with the steps capped "
              f"at {STEP_CAP}; {checked} pip line checked against the repository), {len(failed)} failed")
    assert not failed, "\n".join(failed)
    assert (tmp_path / "compare.html").is_file() and (tmp_path / "run.toml").is_file()
    assert ran >= 15, commands
