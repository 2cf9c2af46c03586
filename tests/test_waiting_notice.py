"""A process waiting for its peers says within seconds that it waits, for whom, and until when."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.steps=1")



@pytest.mark.parametrize(("rank", "whom"), [
    ("0", "the other 1 process(es) of WORLD_SIZE=2 to connect"),
    ("1", "the rendezvous host (rank 0 or the launcher) to answer"),
])
def test_a_lone_process_says_whom_it_waits_for_and_until_when(tmp_path: Path, rank: str, whom: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), WORLD_SIZE="2", RANK=rank, LOCAL_RANK=rank,
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    proc = subprocess.Popen([sys.executable, "-m", "titan_core", *TINY, f"--job.run_dir={tmp_path / 'run'}",
                             "--parallelism.init_timeout_s=8"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.time(), line) for line in proc.stdout or []))
    reader.start()
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
    reader.join()
    text = "".join(line for _, line in lines)
    assert proc.returncode == 2 and "rendezvous gave up after 8 s" in text, text
    notices = [(t, line) for t, line in lines if "is waiting for" in line]
    assert notices, text
    pattern = (rf"\[titan\] rank {rank} is waiting for {re.escape(whom)} at 127\.0\.0\.1:{port}, until "
               r"\d\d:\d\d:\d\d UTC \(parallelism\.init_timeout_s=8\)")
    found = re.search(pattern, notices[0][1])
    assert found, notices[0][1]
    # printed a few seconds into the 8 s wait: its deadline is still about 5 s away when it arrives
    arrived = datetime.datetime.fromtimestamp(notices[0][0], datetime.timezone.utc)
    hh, mm, ss = (int(x) for x in re.search(r"until (\d\d):(\d\d):(\d\d)", notices[0][1]).groups())
    deadline = arrived.replace(hour=hh, minute=mm, second=ss, microsecond=0)
    left = (deadline - arrived).total_seconds() % 86400
    assert 2 <= left <= 8, (left, text)
