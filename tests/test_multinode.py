"""Two "nodes" on one machine: two torch.distributed.run agents meeting at a c10d rendezvous.

Each agent is launched the way a multi-node job launches one per machine
(``--nnodes 2 --node-rank K --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint HOST:PORT --rdzv-id ID``) and runs ``-m titan_core`` with FSDP2
sharded across both. The run must reproduce the single-node 2-rank losses and
gradient norms.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_distributed_cli import COMMON, STEPS, max_rel_diff, torchrun

from conftest import REPO, Run, free_port

FSDP2 = ("--training.local_batch_size=2", "--parallelism.dp_shard=2")
TOLERANCE = 1e-6
TIMEOUT_S = 300



def node_command(node_rank: int, port: int, rdzv_id: str, run_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
        "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", rdzv_id, "-m", "titan_core", *COMMON, f"--job.run_dir={run_dir}", *FSDP2,
    ]


def run_two_nodes(tmp_path: Path) -> tuple[list[int], list[str], Path]:
    """Start both agents, wait for both; kill both process groups on failure, timeout or interrupt."""
    run_dir = tmp_path / "two_nodes"
    port, rdzv_id = free_port(), f"titan-test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    logs = [tmp_path / f"node{k}.log" for k in range(2)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for k in range(2):
            with logs[k].open("wb") as log:
                procs.append(subprocess.Popen(
                    node_command(k, port, rdzv_id, run_dir), cwd=REPO, env=env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                ))
        deadline = time.monotonic() + TIMEOUT_S
        failed_at: float | None = None
        while None in (codes := [p.poll() for p in procs]):  # poll every agent, not just the first
            if failed_at is None and any(code not in (None, 0) for code in codes):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() > failed_at + 30:
                break  # the other node would wait for its failed peer until the rendezvous times out
            if time.monotonic() > deadline:
                pytest.fail(f"two-node run timed out after {TIMEOUT_S}s:\n" + "\n".join(log.read_text() for log in logs))
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs], [log.read_text() for log in logs], run_dir


@pytest.mark.slow
def test_two_nodes_match_single_node(tmp_path: Path) -> None:
    single = torchrun(tmp_path / "single_node", *FSDP2)
    assert single.code == 0, single.text
    reference = single.records()

    codes, outputs, run_dir = run_two_nodes(tmp_path)
    assert codes == [0, 0], "\n".join(outputs)
    records = Run(0, "", "", run_dir).records()
    assert [int(r["step"]) for r in records] == list(range(1, STEPS + 1))
    loss_diff = max_rel_diff(records, reference, "loss")
    norm_diff = max_rel_diff(records, reference, "grad_norm")
    print(f"\ntwo nodes vs one node: max relative loss difference {loss_diff:.3e}, grad_norm {norm_diff:.3e}")
    assert loss_diff <= TOLERANCE, (records, reference)
    assert norm_diff <= TOLERANCE, (records, reference)
    # The rendezvous decides which node hosts global rank 0; only that one reports.
    step_lines = [sum(line.startswith("step ") for line in out.splitlines()) for out in outputs]
    assert sorted(step_lines) == [0, STEPS], outputs
