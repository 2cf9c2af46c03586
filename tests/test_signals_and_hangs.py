"""Real processes, real signals: SIGTERM/SIGINT to the launcher, SIGKILL/SIGSTOP to one rank, a peer that
never comes, and a second run racing the first for one run folder.

Each case asserts the exit code, the one message, how long the run took to stop, and that
the files that were in the run folder before the signal are byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, child_pids, stop_process

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=64",
        "--training.local_batch_size=2", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=2",
        "--training.steps=400")
TWO = ("--nproc-per-node", "2", "--parallelism.dp_shard=2")


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    return {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra}


def start(run_dir: Path, log: Path, *args: str, **extra_env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "titan_core", *TINY, f"--job.run_dir={run_dir}", *args],
                            cwd=REPO, env=env(**extra_env), stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def logged_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(line)["step"] for line in lines if line.endswith("}")), default=0)


def wait_until_training(proc: subprocess.Popen[bytes], run_dir: Path, log: Path, step: int = 3) -> None:
    deadline = time.monotonic() + 120
    while logged_step(run_dir) < step:
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no step {step} in time:\n{log.read_text()}"
        time.sleep(0.05)


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> tuple[int, str, float]:
    """(exit code, output, seconds until the launcher exited)."""
    t0 = time.monotonic()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, log.read_text(), time.monotonic() - t0


def workers(pid: int) -> list[int]:
    """The launcher's worker processes (its children running python)."""
    return child_pids(pid)


def rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


def checkpoint_steps(run_dir: Path) -> list[str]:
    folder = run_dir / "checkpoints"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# ---- SIGTERM / SIGINT -----------------------------------------------------------------------


def test_sigterm_to_the_launcher_saves_at_the_step_boundary_and_exits_143(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("kept\n")
    proc = start(run_dir, log, *TWO, "--checkpoint.enable=true", "--checkpoint.interval=1000")
    wait_until_training(proc, run_dir, log)
    before = snapshot(run_dir)
    os.kill(proc.pid, signal.SIGTERM)
    code, text, seconds = finish(proc, log)
    print(f"\nSIGTERM to the launcher: exited after {seconds:.1f} s\n{text[-400:]}")
    assert code == 143, text
    assert_no_traceback(text)
    lines = [line for line in text.splitlines() if "stopped by SIGTERM" in line]
    assert len(lines) == 1, text
    step = int(lines[0].split("after step ")[1].split(";")[0])
    saved = run_dir / "checkpoints" / f"step-{step:06d}"
    assert f"checkpoint saved to {saved}" in lines[0]
    assert checkpoint_steps(run_dir) == [saved.name]  # published, no .tmp-step left
    assert logged_step(run_dir) == step
    assert seconds < 20, seconds
    after = snapshot(run_dir)
    assert all(after[name] == digest for name, digest in before.items() if name in ("notes.txt",)), (before, after)


def test_sigint_to_the_launcher_exits_130_without_traceback_or_partial_checkpoint(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = start(run_dir, log, *TWO, "--checkpoint.enable=true", "--checkpoint.interval=2")
    wait_until_training(proc, run_dir, log, step=5)
    os.kill(proc.pid, signal.SIGINT)
    code, text, seconds = finish(proc, log)
    assert code == 130, text
    assert_no_traceback(text)
    assert text.count("interrupted (SIGINT)") == 1, text
    names = checkpoint_steps(run_dir)
    assert names and all(name.startswith("step-") for name in names), names  # no .tmp-step-* half save
    assert all((run_dir / "checkpoints" / n / "tensor_index.json").is_file() for n in names)
    assert seconds < 15, seconds


def test_sigterm_to_a_single_process_exits_143_and_says_nothing_was_saved_without_checkpointing(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = start(run_dir, log)
    wait_until_training(proc, run_dir, log)
    os.kill(proc.pid, signal.SIGTERM)
    code, text, seconds = finish(proc, log)
    assert code == 143, text
    assert_no_traceback(text)
    assert "stopped by SIGTERM after step" in text and "no checkpoint saved (checkpointing is off" in text, text
    assert not (run_dir / "checkpoints").exists()
    assert seconds < 10, seconds


# ---- a rank that dies or freezes ----------------------------------------------------------------


def test_a_rank_killed_by_sigkill_stops_the_run_within_10_s_naming_the_rank(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = start(run_dir, log, *TWO)
    wait_until_training(proc, run_dir, log)
    victim = next(pid for pid in workers(proc.pid) if rank_of(pid) == 1)
    os.kill(victim, signal.SIGKILL)
    code, text, seconds = finish(proc, log)
    print(f"\nSIGKILL to rank 1: launcher exited after {seconds:.1f} s\n{text[-600:]}")
    assert code == 128 + signal.SIGKILL, text
    assert_no_traceback(text)
    errors = [line for line in text.splitlines() if "error:" in line]
    assert errors == [f"titan-train: error: rank 1 (pid {victim}) died (killed by SIGKILL: sent by another process or by the "
                      f"kernel's out-of-memory killer; `dmesg | grep -i oom` tells which). Stopped the other 1 "
                      f"rank; checkpoints already published are intact: rerun the same command to resume from "
                      f"the last one."], text
    assert seconds < 10, seconds
    assert workers(proc.pid) == []


def test_a_frozen_rank_stops_the_run_after_the_collective_timeout_naming_the_rank(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    proc = start(run_dir, log, *TWO, "--parallelism.collective_timeout_s=3")
    wait_until_training(proc, run_dir, log)
    victim = next(pid for pid in workers(proc.pid) if rank_of(pid) == 1)
    os.kill(victim, signal.SIGSTOP)
    t0 = time.monotonic()
    code, text, _ = finish(proc, log)
    seconds = time.monotonic() - t0
    print(f"\nSIGSTOP to rank 1 (collective_timeout_s=3): launcher exited after {seconds:.1f} s\n{text[-600:]}")
    assert code == 4, text
    assert_no_traceback(text)
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"rank 1 (pid {victim}) stopped answering" in errors[0], text
    assert 3 <= seconds < 3 + 10, seconds


def test_world_size_2_without_a_peer_gives_up_after_the_init_timeout(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "titan_core", *TINY, f"--job.run_dir={tmp_path / 'run'}", "--parallelism.init_timeout_s=2"],
        cwd=REPO, env=env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert_no_traceback(text)
    assert "rendezvous gave up after 2 s (parallelism.init_timeout_s)" in text, text
    assert seconds < 20, seconds


# ---- one run per folder ---------------------------------------------------------------------------


def test_a_second_run_in_the_same_folder_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "log"
    first = start(run_dir, log, "--checkpoint.enable=true", "--checkpoint.interval=2")
    try:
        wait_until_training(first, run_dir, log)
        stop_process(first.pid)  # hold it still so that the snapshot is stable
        before = snapshot(run_dir)
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "titan_core", *TINY, f"--job.run_dir={run_dir}", *TWO],
                                cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - t0
        assert snapshot(run_dir) == before
    finally:
        os.kill(first.pid, signal.SIGKILL)  # a dead holder: its lock is released by the kernel
        first.wait()
    text = second.stdout + second.stderr
    assert second.returncode == 2, text
    assert_no_traceback(text)
    assert f"the run folder {run_dir} is in use by another run: pid {first.pid} on host {socket.gethostname()}, " \
           f"started 20" in text, text
    assert seconds < 30, seconds
    # The holder is dead: the next run takes the folder over and resumes from its last checkpoint.
    third = subprocess.run([sys.executable, "-m", "titan_core", *TINY, f"--job.run_dir={run_dir}",
                            "--checkpoint.enable=true", "--checkpoint.interval=2", "--training.steps=8"],
                           cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "resuming from" in third.stdout + third.stderr
    assert (run_dir / ".lock").read_bytes() == b""  # nothing is ever written into the lock file


def test_sigint_during_a_checkpoint_save_waits_for_it_to_be_published(tmp_path: Path) -> None:
    """The save of step 4 is held between writing its shards and publishing them (a test hook);
    Ctrl+C arrives right then. The run must publish step 4 whole, then exit 130."""
    run_dir, log, paused = tmp_path / "run", tmp_path / "log", tmp_path / "paused"
    proc = start(run_dir, log, "--checkpoint.enable=true", "--checkpoint.interval=2", "--checkpoint.keep_latest_k=0",
                 "--import", "tests.checkpoint_pause",
                 TEST_PAUSE_SAVE_AT_STEP="4", TEST_PAUSE_FILE=str(paused), TEST_PAUSE_SECONDS="2")
    deadline = time.monotonic() + 120
    while not paused.exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGINT)
    code, text, seconds = finish(proc, log)
    assert code == 130, text
    assert_no_traceback(text)
    assert text.count("interrupted (SIGINT)") == 1, text
    assert checkpoint_steps(run_dir) == ["step-000002", "step-000004"]  # published whole, no .tmp-step-*
    assert (run_dir / "checkpoints" / "step-000004" / "tensor_index.json").is_file()
    assert logged_step(run_dir) == 4  # stopped right after the save: step 5 never ran
    assert seconds < 10, seconds


# ---- a signal while a resume is loading the checkpoint -------------------------------------------


@pytest.fixture(scope="module")
def saved_at_step_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-rank run folder that saved step 2 (made once; each test resumes its own copy)."""
    root = tmp_path_factory.mktemp("saved-at-2")
    run_dir, log = root / "run", root / "log"
    first = start(run_dir, log, *TWO, "--checkpoint.enable=true", "--checkpoint.interval=2", "--training.steps=2")
    code, text, _ = finish(first, log, timeout=120)
    assert code == 0 and checkpoint_steps(run_dir) == ["step-000002"], text
    return run_dir


def _resume_paused_in_load(tmp_path: Path, saved: Path, *, pause_s: float = 4
                           ) -> tuple[subprocess.Popen[bytes], Path, Path, dict[str, str]]:
    """A copy of the 2-rank run that saved step 2, resumed by a second run whose ranks are both held inside the
    load for ``pause_s`` seconds."""
    run_dir, log, paused = tmp_path / "run", tmp_path / "log", tmp_path / "paused"
    shutil.copytree(saved, run_dir)
    before = snapshot(run_dir / "checkpoints")
    proc = start(run_dir, log, *TWO, "--checkpoint.enable=true", "--checkpoint.interval=1000", "--training.steps=400",
                 "--import", "tests.faults.load_pause", TEST_LOAD_PAUSE_FILE=str(paused),
                 TEST_LOAD_PAUSE_SECONDS=str(pause_s))
    deadline = time.monotonic() + 120
    while not all(Path(f"{paused}.{rank}").exists() for rank in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    return proc, run_dir, log, before


def test_sigint_while_a_resume_loads_exits_130_and_leaves_the_checkpoint_untouched(
        tmp_path: Path, saved_at_step_2: Path) -> None:
    proc, run_dir, log, before = _resume_paused_in_load(tmp_path, saved_at_step_2)
    os.kill(proc.pid, signal.SIGINT)
    code, text, seconds = finish(proc, log)
    assert code == 130, text
    assert_no_traceback(text)
    assert text.count("interrupted (SIGINT)") == 1, text
    assert snapshot(run_dir / "checkpoints") == before  # nothing added, nothing changed
    assert seconds < 10, seconds


def test_sigterm_while_a_resume_loads_stops_at_once_with_143_and_leaves_the_checkpoint_untouched(
        tmp_path: Path, saved_at_step_2: Path) -> None:
    """Setting up has no step boundary near and nothing trained to save, so SIGTERM stops it at once: a load
    held for 60 s (as a slow or hung read would be) ends within seconds, where the request used to wait for
    the load, one step and a save, past a scheduler's grace period."""
    proc, run_dir, log, before = _resume_paused_in_load(tmp_path, saved_at_step_2, pause_s=60)
    os.kill(proc.pid, signal.SIGTERM)
    code, text, seconds = finish(proc, log)
    assert code == 143, text
    assert_no_traceback(text)
    lines = [line for line in text.splitlines() if "stopped by SIGTERM" in line]
    assert lines == ["titan-train: stopped by SIGTERM while setting the run up, before its first step; "
                     "nothing new to save"], text
    assert snapshot(run_dir / "checkpoints") == before  # nothing added, nothing changed
    assert seconds < 15, seconds
