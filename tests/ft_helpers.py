"""Helpers for the fault-tolerance tests: run the local supervisor, kill a group at a step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, child_pids

BIN = Path(sys.executable).parent
SMALL = ("--spec", "llama3", "--flavor", "debugmodel", "--training.seq_len=128",
         "--training.local_batch_size=4", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=2")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def start(run_dir: Path, *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """titan-train in its own session; its output piped, or written to ``log`` for a process nobody reads
    while it runs (a full pipe would stall it: torchft logs every quorum)."""
    out = subprocess.PIPE if log is None else log.open("w")
    return subprocess.Popen([str(BIN / "titan-train"), *SMALL, f"--job.run_dir={run_dir}", *args],
                            stdout=out, stderr=subprocess.STDOUT, text=True, env=env(),
                            start_new_session=True)


def steps_logged(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return [r for r in out if "loss" in r]


def replica_pid(supervisor: subprocess.Popen[str], replica_id: int) -> int:
    for pid in child_pids(supervisor.pid):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if f"--fault_tolerance.replica_id={replica_id}".encode() in cmd:
            return pid
    raise AssertionError(f"replica {replica_id} is not running")


def wait_step(run_dir: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in steps_logged(run_dir)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{run_dir} did not reach step {step}")


def kill_at(supervisor: subprocess.Popen[str], run_dir: Path, replica_id: int, step: int) -> None:
    wait_step(run_dir / f"replica_{replica_id}", step)
    os.kill(replica_pid(supervisor, replica_id), signal.SIGKILL)
