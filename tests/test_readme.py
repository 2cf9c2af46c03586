"""The README's first two commands are the project's front door: keep them true."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO


def readme_commands() -> list[str]:
    lines = (REPO / "README.md").read_text().splitlines()
    assert lines[0] == "```bash", "the README must open with its two commands"
    commands = []
    for line in lines[1:]:
        if line.startswith("```"):
            break
        commands.append(line.split("#", 1)[0].strip())
    return commands


def test_readme_opens_with_exactly_two_commands() -> None:
    assert readme_commands() == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci/run").read_text()
    assert "scripts/test.sh" in ci


@pytest.mark.parametrize(("pytest_rc", "expected_rc"), [(0, 0), (1, 1), (2, 2), (5, 1)])
def test_ci_fails_when_pytest_collects_nothing(tmp_path: Path, pytest_rc: int, expected_rc: int) -> None:
    """.ci/run -> scripts/test.sh with a stand-in pytest: exit code 5 (no tests) must fail CI."""
    _stand_in_ci(tmp_path, pytest_rc=pytest_rc)
    result = subprocess.run(["bash", str(tmp_path / ".ci/run")], capture_output=True, text=True, timeout=60)
    assert result.returncode == expected_rc, result.stdout + result.stderr
    assert "ran python: -m pytest -q --durations=30 -n 2 --dist loadfile" in result.stdout  # two workers by default
    if pytest_rc == 5:
        assert "pytest collected no tests: failing" in result.stderr


def _stand_in_ci(root: Path, *, pytest_rc: int = 0, ruff_rc: int = 0, mypy_rc: int = 0) -> None:
    """The CI scripts as they are, over a stand-in venv whose tools say what they ran and exit as told."""
    for script in (".ci/run", "scripts/test.sh", "scripts/lint.sh"):
        (root / script).parent.mkdir(parents=True, exist_ok=True)
        (root / script).write_text((REPO / script).read_text())
    (root / "scripts/setup.sh").write_text("exit 0\n")
    (root / "scripts/install_chromium.sh").write_text("exit 0\n")
    (root / ".venv/bin").mkdir(parents=True)
    for tool, rc in (("python", pytest_rc), ("ruff", ruff_rc), ("mypy", mypy_rc), ("lint-imports", 0), ("titan-plugin", 0)):
        (root / ".venv/bin" / tool).write_text(f"#!/bin/sh\necho \"ran {tool}: $*\"\nexit {rc}\n")
        (root / ".venv/bin" / tool).chmod(0o755)


def test_ci_lints_and_type_checks_before_the_tests(tmp_path: Path) -> None:
    _stand_in_ci(tmp_path)
    result = subprocess.run(["bash", str(tmp_path / ".ci/run")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line.split(":")[0].removeprefix("ran ") for line in result.stdout.splitlines() if line.startswith("ran ")]
    # the tree and its import contracts, then the two scaffolds as generated (titan-plugin new prints
    # nothing here), then the tests
    assert ran == ["ruff", "mypy", "lint-imports", "ruff", "mypy", "python"]
    assert "ran ruff: check src plugins tests examples benchmarks scripts" in result.stdout
    assert "ran mypy: --strict " in result.stdout


@pytest.mark.parametrize("failing", ["ruff", "mypy"])
def test_ci_fails_on_a_lint_or_type_error_without_running_the_tests(tmp_path: Path, failing: str) -> None:
    _stand_in_ci(tmp_path, **{f"{failing}_rc": 1})
    result = subprocess.run(["bash", str(tmp_path / ".ci/run")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ran python" not in result.stdout


def test_ci_fails_when_chromium_cannot_be_installed_without_running_the_tests(tmp_path: Path) -> None:
    """The install runs beside the lint (.ci/run): its failure still stops CI, with its own output shown."""
    _stand_in_ci(tmp_path)
    (tmp_path / "scripts/install_chromium.sh").write_text("echo 'E: Unable to locate package chromium' >&2\nexit 100\n")
    result = subprocess.run(["bash", str(tmp_path / ".ci/run")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 100, result.stdout + result.stderr
    assert "ran mypy" in result.stdout and "ran python" not in result.stdout
    assert "E: Unable to locate package chromium" in result.stdout + result.stderr
    assert "CI: installing Chromium failed (exit 100)" in result.stderr


@pytest.mark.slow
def test_quickstart_script_trains(tmp_path: Path) -> None:
    """Runs the README's first command (its script), shortened by a later override flag."""
    metrics = tmp_path / "quickstart" / "metrics.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    env.pop("PYTHONPATH", None)
    # Later flags win: the run goes to tmp_path, so the test writes nothing into the checkout.
    proc = subprocess.run(["bash", "scripts/quickstart.sh", "--training.steps=30", "--training.seq_len=64",
                           f"--job.run_dir={tmp_path / 'quickstart'}"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines() if '"loss"' in line]
    assert records[-1]["step"] == 30
    assert records[-1]["loss"] < records[0]["loss"]
    assert "step     30 | loss" in proc.stdout
    assert "[setup] " in proc.stdout  # the set-up stage says what it does
    # It ends with the report's path and a sample of what the model learned.
    report = tmp_path / "quickstart" / "report.html"
    assert f"Report (open it in a browser): {report}\n" in proc.stdout and report.is_file()
    assert (tmp_path / "quickstart" / "report-loss.png").is_file()
    # The built-in evaluation tasks ran (at the last step here) and the report draws them.
    assert 'data-metric="eval-python_syntax-acc"' in report.read_text()
    tail = proc.stdout.split("A greedy continuation of 'The \"for\" statement'", 1)[1].splitlines()
    assert tail[1].startswith('The "for" statement') and len(tail[1]) > len('The "for" statement') + 10
    assert "greedy, with a KV cache" in proc.stderr
