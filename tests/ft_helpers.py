"""Helpers for the fault-tolerance tests: run the local supervisor, kill a group at a step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, descendants

BIN = Path(sys.executable).parent
SMALL = ("--spec", "llama3", "--flavor", "debugmodel", "--training.seq_len=128",
         "--training.local_batch_size=4", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=2")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def start(run_dir: Path, *args: str, log: Path | None = None,
          env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """titan-train in its own session; its output piped, or written to ``log`` for a process nobody reads
    while it runs (a full pipe would stall it: torchft logs every quorum)."""
    out = subprocess.PIPE if log is None else log.open("w")
    return subprocess.Popen([str(BIN / "titan-train"), *SMALL, f"--job.run_dir={run_dir}", *args],
                            stdout=out, stderr=subprocess.STDOUT, text=True, env={**env(), **(env_extra or {})},
                            start_new_session=True)


def steps_logged(run_dir: Path, *, superseded: bool = False) -> list[dict[str, float]]:
    """The step records of metrics.jsonl (with ``superseded``: also those a restarted group moved aside,
    the steps its earlier life committed)."""
    paths = [run_dir / "metrics.jsonl", *([run_dir / "metrics.superseded.jsonl"] if superseded else [])]
    out = []
    for line in (ln for path in paths if path.exists() for ln in path.read_text().splitlines()):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return [r for r in out if "loss" in r]


def replica_pid(run_dir: Path, replica_id: int) -> int:
    """The group's process (its launcher with --nproc-per-node), from the pid file the supervisor writes."""
    return int((run_dir / f"replica_{replica_id}.pid").read_text())


def wait_step(run_dir: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in steps_logged(run_dir)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{run_dir} did not reach step {step}")


def kill_at(supervisor: subprocess.Popen[str], run_dir: Path, replica_id: int, step: int) -> None:
    """SIGKILL the whole group (with --nproc-per-node: its launcher and every worker, as a lost node)."""
    wait_step(run_dir / f"replica_{replica_id}", step)
    pid = replica_pid(run_dir, replica_id)
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def finished_after_kills(supervisor: subprocess.Popen[str], log: Path, *killed: int) -> tuple[str, list[str]]:
    """Wait for a supervisor that must succeed after ``killed`` groups each died once, in that order:
    (its whole output, its ``[ft]`` lines)."""
    supervisor.wait(timeout=300)
    out = log.read_text()
    assert supervisor.returncode == 0, out[-3000:]
    ft = [line for line in out.splitlines() if line.startswith("[ft]")]
    assert [line for line in ft if " died " in line] == [
        f"[ft] replica {i} died (SIGKILL); restart 1 of 3" for i in killed], ft
    return out, ft


def committed_losses(run_dir: Path, groups: int) -> dict[int, set[float]]:
    """step -> the losses the groups committed at it (one value when they agree)."""
    out: dict[int, set[float]] = {}
    for i in range(groups):
        for r in steps_logged(run_dir / f"replica_{i}", superseded=True):
            out.setdefault(int(r["step"]), set()).add(r["loss"])
    return out


def absent_windows(run_dir: Path, groups: int) -> str:
    """The test-only TITAN_FT_TEST_ABSENT value replaying a run's membership: each group sits out the
    steps committed by fewer than all groups (``ft_replicas``) that it did not commit itself."""
    logged = [{int(r["step"]): r for r in steps_logged(run_dir / f"replica_{i}", superseded=True)} for i in range(groups)]
    short = sorted({s for g in logged for s, r in g.items() if r["ft_replicas"] < groups})
    windows = []
    for i in range(groups):
        steps = [s for s in short if s not in logged[i]]
        for s in steps:  # contiguous runs of steps as FIRST-LAST
            if windows and windows[-1][0] == i and windows[-1][2] == s - 1:
                windows[-1][2] = s
            else:
                windows.append([i, s, s])
    # every short step is explained: exactly groups - ft_replicas groups were absent from it
    for s in short:
        n = next(g[s]["ft_replicas"] for g in logged if s in g)
        assert sum(1 for w in windows if w[1] <= s <= w[2]) == groups - n, (s, windows)
    return ",".join(f"{i}:{a}-{b}" for i, a, b in windows)


def rejoin_seconds(output: str) -> list[float]:
    """The supervisor's '(X.Ys after its restart)' figures."""
    return [float(m) for m in re.findall(r"rejoined from replica \d+ \(([\d.]+)s after its restart\)", output)]


def wait_line(log: Path, text: str, proc: subprocess.Popen[str], timeout: float = 180) -> None:
    """Until ``text`` is in the log a process writes (it must not end first)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout:g}s: {log.read_text()[-3000:]}"
        time.sleep(0.1)
