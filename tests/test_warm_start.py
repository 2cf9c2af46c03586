"""The suite's warm start (tests/warm_start.py) runs a command as a cold ``python -m titan_core`` would.

Most of the suite's ``python -m titan_core`` runs go through it, so what a command sees there must be what it
sees in a process of its own: the same exit code and output, its own working folder, environment, PYTHONPATH
and thread count; a signal sent to the process a test started reaches the command; a killed client leaves no
command behind.
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
import warm_start

import conftest
from conftest import REPO, alive, descendants, titan_command, warm_path

# Imported by the command (--import): prints what the command sees, then the run stops on the unknown spec.
PROBE = """
import os, sys, torch
print("cwd", os.getcwd(), file=sys.stderr)
print("env", os.environ.get("PROBE_VALUE"), file=sys.stderr)
print("path", sys.path[:3], file=sys.stderr)
print("threads", torch.get_num_threads(), file=sys.stderr)
print("argv0", os.path.basename(sys.argv[0]), file=sys.stderr)
"""

pytestmark = pytest.mark.skipif(not warm_start.enabled(), reason="TITAN_TEST_WARM=0: nothing starts warm to compare")


def _both(args: list[str], *, cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """The command run cold, then warm."""
    return [subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
            for cmd in ([sys.executable, "-m", "titan_core", *args], titan_command(*args))]


def test_a_warm_command_sees_and_prints_what_a_cold_one_does(tmp_path: Path) -> None:
    (tmp_path / "probe_site").mkdir()
    (tmp_path / "probe_site" / "warm_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": f"probe_site{os.pathsep}{REPO}", "PROBE_VALUE": "seen", "OMP_NUM_THREADS": "1"}
    cold, warm = _both(["--import", "warm_probe", "--spec", "nosuchspec"], cwd=tmp_path, env=env)
    assert cold.returncode == warm.returncode == 2, (cold.stderr, warm.stderr)
    assert warm.stdout == cold.stdout and warm.stderr == cold.stderr, (cold.stderr, warm.stderr)
    assert f"cwd {tmp_path}" in warm.stderr and "env seen" in warm.stderr and "threads 1" in warm.stderr
    assert f"path ['{tmp_path}', '{tmp_path / 'probe_site'}', '{REPO}']" in warm.stderr, warm.stderr
    assert "argv0 __main__.py" in warm.stderr and 'unknown spec "nosuchspec"' in warm.stderr

    # A shell's `titan-train` (conftest.warm_path): the console script, its folder first on sys.path, not the
    # working folder.
    bin_dir = Path(sys.executable).parent
    cold, warm = (subprocess.run([str(folder / "titan-train"), "--import", "warm_probe", "--spec", "nosuchspec"],
                                 cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
                  for folder in (bin_dir, Path(warm_path()[0])))
    assert cold.returncode == warm.returncode == 2 and warm.stderr == cold.stderr, (cold.stderr, warm.stderr)
    assert f"path ['{bin_dir}', '{tmp_path / 'probe_site'}', '{REPO}']" in warm.stderr, warm.stderr
    assert "argv0 titan-train" in warm.stderr, warm.stderr

    env["OMP_NUM_THREADS"] = "2"
    cold, warm = _both(["--spec", "llama3", "--training.steps=-3"], cwd=tmp_path, env=env)
    assert cold.returncode == warm.returncode == 2 and warm.stderr == cold.stderr, (cold.stderr, warm.stderr)
    cold, warm = _both(["--spec", "llama3", "--print-config"], cwd=tmp_path, env=env)
    assert cold.returncode == warm.returncode == 0 and warm.stdout == cold.stdout and "[training]" in warm.stdout


def test_a_signal_reaches_the_command_and_a_killed_client_takes_the_command_with_it(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    args = ["--spec", "llama3", "--llama3.n_layers=1", "--training.seq_len=32", "--training.steps=100000",
            "--checkpoint.enable=true", "--checkpoint.interval=100000", "--metrics.log_freq=1"]

    def started(name: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(titan_command(*args, f"--job.run_dir={tmp_path / name}"), cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:  # the first step is done: the run is past its start-up
            if line.startswith("step "):
                return proc
        raise AssertionError(f"no step printed; exit {proc.wait()}")

    # SIGTERM: the run saves at the step boundary and exits 143, as a run in its own process does.
    term = started("term")
    term.send_signal(signal.SIGTERM)
    out = term.communicate(timeout=120)[0]
    assert term.returncode == 143 and "stopped by SIGTERM after step" in out, out
    assert [p.name for p in (tmp_path / "term" / "checkpoints").iterdir() if p.name.startswith("step-")], out

    # SIGKILL to the client: the command (the forked process, whose pid the client is told) dies too.
    env[warm_start.PID_FILE_ENV] = str(tmp_path / "command.pid")
    killed = started("killed")
    command = int((tmp_path / "command.pid").read_text())
    assert alive(command)
    killed.kill()
    killed.wait(timeout=30)
    deadline = time.monotonic() + 30
    while alive(command) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(command), f"the command {command} outlived its killed client"


def test_warm_workers_train_as_cold_ones_and_end_with_their_launcher(tmp_path: Path) -> None:
    """TITAN_TEST_WARM_WORKERS=1 (what conftest.run_command sets): the launcher's workers are forks of the server.
    The same figures as cold workers, bit for bit; a worker error is still handed to the launcher (printed once);
    a launcher killed outright takes its workers with it."""
    args = ["--nproc-per-node", "2", "--spec", "llama3", "--llama3.n_layers=2", "--training.seq_len=64",
            "--training.steps=3", "--metrics.log_freq=1", "--parallelism.dp_shard=2"]
    lines = {}
    for workers in ("0", "1"):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), warm_start.WORKERS_ENV: workers}
        run_dir = tmp_path / f"run{workers}"
        done = subprocess.run(titan_command(*args, f"--job.run_dir={run_dir}"), env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        lines[workers] = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
        failed = subprocess.run(titan_command(*args, f"--job.run_dir={tmp_path / 'bad'}", "--data.source=/nope.txt"),
                                env=env, capture_output=True, text=True, timeout=300)
        assert failed.returncode == 2 and failed.stderr.count('data.source "/nope.txt" does not exist') == 1, \
            failed.stderr
    strip = [[{k: v for k, v in json.loads(line).items() if k in ("step", "loss", "grad_norm")} for line in lines[w]]
             for w in ("0", "1")]
    assert len(strip[0]) == 3 and strip[0] == strip[1]

    # Killed outright (SIGKILL to the process a test started): no worker outlives it.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), warm_start.WORKERS_ENV: "1"}
    long_run = [*args[:-3], "--training.steps=100000", f"--job.run_dir={tmp_path / 'long'}"]
    proc = subprocess.Popen(titan_command(*long_run), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step"):
            break
    # Every command the server forked runs in a session of its own: the launcher and its two workers.
    server = conftest._warm()
    assert server is not None and server.server is not None
    workers = [p for p in descendants(server.server.pid) if os.getsid(p) == p]
    assert len(workers) == 3, workers
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in workers)

