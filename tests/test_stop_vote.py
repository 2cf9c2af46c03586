"""The ranks' SIGTERM vote (train/stop_vote.py) on two real gloo processes: a signal that reaches one
rank only stops both after the same step, one step late on a step that reads its vote late, at once on
a step that reads it at once; a run without a signal never stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import free_port

WORKER = r"""
import json, os, signal, sys
import torch.distributed as dist
import torch
from titan_core.runtime import signals
from titan_core.train.stop_vote import StopVote

dist.init_process_group("gloo")
rank = dist.get_rank()
results = []
for signal_at, read_now_steps in json.loads(sys.argv[1]):
    signals._state["term"] = 0
    vote = StopVote(torch.device("cpu"), distributed=True)
    stopped_after = 0
    for step in range(1, 11):
        if rank == 1 and step == signal_at:
            signals._state["term"] = int(signal.SIGTERM)  # what the handler records; only rank 1 got it
        if vote.after_step(read_now=step in read_now_steps):
            stopped_after = step
            break
    vote.close()
    results.append(stopped_after)
print(json.dumps(results))
dist.destroy_process_group()
"""



SCENARIOS = [  # (rank 1 gets SIGTERM in step, steps that read the vote at once, both stop after step)
    (3, [1, 5, 10], 4),   # cast after step 3, read after step 4
    (4, [1, 5, 10], 5),   # step 4's vote read at step 5 (which also reads its own)
    (5, [1, 5, 10], 5),   # a step that reads at once stops at once
    (0, [1, 5, 10], 0),   # no signal: all 10 steps
    (7, [], 8),           # no step reads at once: always one late
]


def test_a_signal_on_one_rank_stops_both_after_the_same_step(tmp_path: Path) -> None:
    port = free_port()
    procs = []
    scenarios = json.dumps([[signal_at, read_now] for signal_at, read_now, _ in SCENARIOS])
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, scenarios], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=tmp_path))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    expected = [stop for _, _, stop in SCENARIOS]
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out
        assert json.loads(out.strip().splitlines()[-1]) == expected, out
