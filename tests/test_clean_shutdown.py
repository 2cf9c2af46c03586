"""Distributed runs end cleanly: four short 2-process runs (2 TP, 2 FSDP2) all exit 0.

Some 2-process TP runs used to print ``done`` and then abort with ``terminate called
without an active exception`` (exit 1) while the interpreter tore down torch's C++
threads; workers now leave through ``titan_core.runtime.worker_exit.exit_process``. The runs
are tiny (the core's tiny model, one step) and all four go at once; each still starts a real
launcher and two gloo workers. (Twenty runs, then twelve, until the CI budget ran short: the exit
path has not failed since it moved to ``exit_process``, and every other multi-process test of the
suite also fails on an exit code other than 0.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RUNS = [("tp", "--parallelism.tp=2")] * 2 + [("fsdp", "--parallelism.dp_shard=2")] * 2


def _run(tmp_path: Path, i: int, layout: str) -> tuple[int, str]:
    run_dir = tmp_path / f"run{i}"
    cmd = [sys.executable, "-m", "titan_core", "--import", "titan_core.testing.tiny_spec", "--spec", "tiny",
           "--training.steps=1", "--training.seq_len=32", "--training.local_batch_size=2", f"--job.run_dir={run_dir}",
           "--nproc-per-node", "2", layout]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return proc.returncode, proc.stdout + proc.stderr


def test_four_short_distributed_runs_all_exit_zero(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: _run(tmp_path, *job), enumerate(flag for _, flag in RUNS)))
    bad = [(name, code, out[-800:]) for (name, _), (code, out) in zip(RUNS, results)
           if code != 0 or "terminate called" in out or "[titan] done: 1 steps" not in out]
    assert not bad, bad
