"""SIGKILL a 2-rank run (launcher and workers, like a lost machine), rerun the same command, finish exactly.

``titan-train --nproc-per-node 2`` runs torch.distributed.run inside the launched
process, and torchrun starts each worker in a session of its own, so killing
the launcher's process group alone would leave the workers training (they talk
to each other directly). The tests therefore collect the launcher's whole
process tree and SIGKILL every group in it at once.

Both cases end with the rerun's 20 losses bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, CliResult, alive, descendants, run_cli

COMMAND = (
    "--nproc-per-node", "2", "--parallelism.dp_shard=2", "--spec", "llama3", "--flavor", "debugmodel",
    "--llama3.n_layers=2", "--training.seq_len=32", "--training.local_batch_size=2", "--metrics.log_freq=1",
    "--lr_scheduler.warmup_steps=2", "--training.steps=20", "--checkpoint.enable=true", "--checkpoint.interval=10",
)
TIMEOUT_S = 180


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra}


def start(run_dir: Path, log: Path, **extra_env: str) -> subprocess.Popen[bytes]:
    """Start the run with the test-only pause module imported (it pauses only when TEST_PAUSE_* says so)."""
    return subprocess.Popen(
        [sys.executable, "-m", "titan_core", *COMMAND, "--import", "tests.checkpoint_pause", f"--job.run_dir={run_dir}"],
        cwd=REPO,
        env=env_with(**extra_env), stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher's group and each worker's own group, then wait until none is left."""
    workers = descendants(proc.pid)
    assert len([p for p in workers if alive(p)]) >= 2, "expected the two torchrun workers to be running"
    groups = {proc.pid} | {os.getpgid(p) for p in workers if alive(p)}
    for group in groups:
        os.killpg(group, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers):
        assert time.monotonic() < deadline, "a worker survived SIGKILL"
        time.sleep(0.05)


def wait_for(condition, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()}"
        time.sleep(0.02)


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    # the last line may be half-written while we read
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def losses(run_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out[int(record["step"])] = record["loss"]  # a re-run step's last record wins
    return out


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def rerun(run_dir: Path) -> CliResult:
    result = run_cli(*COMMAND, f"--job.run_dir={run_dir}", timeout=TIMEOUT_S)
    assert result.code == 0, result.text
    assert f"resuming from {run_dir}/checkpoints/step-000010 at step 10" in result.text
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    run_dir = tmp_path_factory.mktemp("reference")
    result = run_cli(*COMMAND, f"--job.run_dir={run_dir}", timeout=TIMEOUT_S)
    assert result.code == 0, result.text
    return losses(run_dir)


def test_sigkill_mid_training_resumes_from_the_last_checkpoint_and_ends_exactly(
        reference: dict[int, float], tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "killed.log"
    # The pause at step 20's save is a guard only: even on a very slow machine the run
    # cannot publish step 20 before the kill, so the kill always lands between saves.
    proc = start(run_dir, log, TEST_PAUSE_SAVE_AT_STEP="20", TEST_PAUSE_SECONDS="600")
    try:
        wait_for(lambda: max(logged_steps(run_dir), default=0) >= 12, proc, log, "step 12 in metrics.jsonl")
        assert checkpoints(run_dir) == ["step-000010"]
        kill_tree(proc)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    at_kill = max(logged_steps(run_dir))
    assert 12 <= at_kill < 20, f"killed at step {at_kill}: not between the checkpoints of steps 10 and 20"
    assert checkpoints(run_dir) == ["step-000010"]

    result = rerun(run_dir)
    assert f"last step {reference[20]:.4f}" in result.text
    assert losses(run_dir) == reference  # bit-identical: steps 11..at_kill were redone from step 10


def test_sigkill_while_writing_a_checkpoint_resumes_from_the_previous_one_and_ends_exactly(
        reference: dict[int, float], tmp_path: Path) -> None:
    run_dir, log, pause_file = tmp_path / "run", tmp_path / "killed.log", tmp_path / "paused"
    proc = start(run_dir, log, TEST_PAUSE_SAVE_AT_STEP="20", TEST_PAUSE_FILE=str(pause_file), TEST_PAUSE_SECONDS="600")
    try:
        wait_for(pause_file.exists, proc, log, "the pause inside the save of step 20")
        time.sleep(0.5)  # both ranks reach the pause (each writes the file)
        kill_tree(proc)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    partial = Path(pause_file.read_text())
    assert partial.name.startswith(".tmp-step-000020-") and (partial / "tensor_index.json").is_file()
    assert checkpoints(run_dir) == [partial.name, "step-000010"]  # the half-done save is not a step-N folder

    result = rerun(run_dir)
    assert f"removed the interrupted save {partial}" in result.text
    assert checkpoints(run_dir) == ["step-000010", "step-000020"]
    assert losses(run_dir) == reference  # bit-identical, the final loss included
