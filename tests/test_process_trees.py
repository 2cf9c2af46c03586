"""Whole process trees end with their parent, and no supervisor waits for ever (issue 31, items 1 and 3).

Each case runs real processes: ``titan-data prepare`` with two workers, SIGKILLed mid-run; the
fault-tolerance supervisor (``_fake_supervisor.py``: the real supervisor, lighthouse and spare, each
replica group a stand-in process that never answers) SIGKILLed, or with a group or the lighthouse
SIGSTOPped. What must happen: nothing is left running, and the supervisor ends within
``quorum_timeout_s`` plus its grace, naming what it waited for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, alive, descendants, stop_process

ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "OMP_NUM_THREADS": "1"}


def wait_until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gone_within(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive (zombies count as gone) ``timeout`` seconds from now, or [] as soon as none is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_a_sigkilled_titan_data_prepare_leaves_no_worker(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with big.open("w") as f:
        for i in range(20000):
            f.write(json.dumps({"text": f"document {i} " + "some words to tokenize here " * 20}) + "\n")
    cmd = [sys.executable, "-m", "titan_core.commands.data_prepare", "prepare", str(big), "--tokenizer", "builtin",
           "--out", str(tmp_path / "out"), "--shard-tokens", "20000", "--workers", "2", "--quiet"]
    proc = subprocess.Popen(cmd, env=ENV, start_new_session=True)
    try:
        wait_until(lambda: len(descendants(proc.pid)) >= 2 or proc.poll() is not None, 120, "two workers")
        workers = descendants(proc.pid)
        assert proc.poll() is None and len(workers) >= 2, "prepare finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)  # the tool alone, as the OOM killer would
        proc.wait()
        assert gone_within(workers, 15) == []
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if any(alive(p) for p in descendants(proc.pid)) else None


def start_supervisor(run_dir: Path, *, quorum_timeout_s: float = 2, grace_s: float = 1) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/_fake_supervisor.py"), str(run_dir),
                             str(quorum_timeout_s), str(grace_s)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    names = ["lighthouse.pid", "replica_0.pid", "replica_1.pid", "spare.pid"]
    wait_until(lambda: all((run_dir / n).exists() for n in names) or proc.poll() is not None, 60, "the pid files")
    assert proc.poll() is None, proc.communicate()[0]
    return proc


def pid(run_dir: Path, name: str) -> int:
    return int((run_dir / f"{name}.pid").read_text())


def test_a_sigkilled_supervisor_leaves_no_process_running(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sup = start_supervisor(run_dir)
    children = [pid(run_dir, n) for n in ("lighthouse", "replica_0", "replica_1", "spare")]
    try:
        assert all(alive(p) for p in children)
        os.kill(sup.pid, signal.SIGKILL)
        sup.wait()
        assert gone_within(children, 15) == []
    finally:
        for p in children:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_stopped_replica_group_is_killed_after_quorum_timeout(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sup = start_supervisor(run_dir)
    group = pid(run_dir, "replica_1")
    stop_process(group)
    t0 = time.monotonic()
    out, _ = sup.communicate(timeout=60)
    assert f"[ft] replica 1 (pid {group}) has been stopped (SIGSTOP?) for more than " \
           "fault_tolerance.quorum_timeout_s=2s; killing it." in out, out
    assert "[ft] replica 1 died (SIGKILL) after 0 restarts" in out, out
    assert sup.returncode == 6 and time.monotonic() - t0 < 30, (sup.returncode, out)
    assert not alive(group) and not alive(pid(run_dir, "replica_0"))


def test_a_stopped_lighthouse_is_killed_and_groups_that_never_stop_are_killed_after_the_grace(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sup = start_supervisor(run_dir)
    lighthouse = pid(run_dir, "lighthouse")
    stop_process(lighthouse)
    out, _ = sup.communicate(timeout=60)
    assert f"[ft] the lighthouse (pid {lighthouse}) has been stopped (SIGSTOP?) for more than " \
           "fault_tolerance.quorum_timeout_s=2s; killing it." in out, out
    assert "[ft] the lighthouse died (SIGKILL)" in out, out
    for replica in (0, 1):  # stand-ins that ignore the lost lighthouse: the supervisor's wait is bounded
        assert f"[ft] replica {replica} (pid {pid(run_dir, f'replica_{replica}')}) did not stop within 3s " \
               "(fault_tolerance.quorum_timeout_s + 1s) of the run stopping; killing it." in out, out
    assert sup.returncode == 5, (sup.returncode, out)
    assert not any(alive(pid(run_dir, n)) for n in ("lighthouse", "replica_0", "replica_1", "spare"))
