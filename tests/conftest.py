"""Shared test helpers: run the real CLI in a subprocess or in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600) -> CliResult:
    """``python -m titan_core ARGS`` in a fresh process (what a user's shell runs)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "titan_core", *args], cwd=cwd or REPO, env=full_env,
        capture_output=True, text=True, timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class Run:
    """A finished run of the CLI (possibly several processes) and the folder it wrote."""

    code: int
    out: str
    err: str
    run_dir: Path

    @property
    def text(self) -> str:
        return self.out + self.err

    def records(self) -> list[dict[str, float]]:
        """The training-step records of ``metrics.jsonl`` (validation records left out)."""
        return [r for r in self.all_records() if "loss" in r]

    def all_records(self) -> list[dict[str, float]]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def run_command(cmd: list[str], *, run_dir: Path, timeout: float = 300) -> Run:
    """Run ``cmd`` in its own process group, killing the whole group (workers too) on timeout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out}\n{err}") from None
    finally:
        if proc.poll() is None:  # the test was interrupted: leave no worker behind
            os.killpg(proc.pid, signal.SIGKILL)
    return Run(proc.returncode, out, err, run_dir)


def titan(run_dir: Path, *args: str, nproc: int | None = None, timeout: float = 300) -> Run:
    """``python -m titan_core [--nproc-per-node N] --job.run_dir=RUN_DIR ARGS``."""
    launch = ["--nproc-per-node", str(nproc)] if nproc else []
    cmd = [sys.executable, "-m", "titan_core", *launch, f"--job.run_dir={run_dir}", *args]
    return run_command(cmd, run_dir=run_dir, timeout=timeout)


def torchrun(run_dir: Path, *args: str, nproc: int = 2, timeout: float = 300) -> Run:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m titan_core ARGS``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "titan_core", f"--job.run_dir={run_dir}", *args]
    return run_command(cmd, run_dir=run_dir, timeout=timeout)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    """The CLI's ``main`` in this process (fast; same code path after process start)."""
    from titan_core.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    return lambda *args: run_main(capsys, *args)


def assert_user_error(result: CliResult, *fragments: str, code: int = 2) -> None:
    """Exit code, every fragment in the message, and no Python traceback."""
    assert result.code == code, result.text
    for fragment in fragments:
        assert fragment in result.text, f"{fragment!r} not in:\n{result.text}"
    assert "Traceback (most recent call last)" not in result.text, result.text


SMALL_RUN = ["training.seq_len=64", "training.local_batch_size=4", "metrics.log_freq=1", "lr_scheduler.warmup_steps=2"]


def trained(run_dir: Path, *pairs: str) -> tuple[Any, list[float]]:
    """(Trainer, losses) of a small in-process run; ``pairs`` are ``section.key=value`` overrides."""
    from titan_core import Trainer
    from titan_core.config.resolve import resolve_config

    overrides = [tuple(p.split("=", 1)) for p in (*SMALL_RUN, f"job.run_dir={run_dir}", *pairs)]
    trainer = Trainer(resolve_config(config_source=None, override_pairs=overrides))  # type: ignore[arg-type]
    trainer.setup()
    return trainer, trainer.train()
