"""docs/fault-tolerance.md runs as written: its local demos (the cluster recipe needs Slurm and a
lighthouse host), in one empty folder, with this environment's tools first on PATH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ft_helpers import rejoin_seconds

from doc_commands import blocks, run_blocks

pytest.importorskip("torchft")


def test_the_local_demos_of_the_fault_tolerance_guide_run_as_written(tmp_path: Path) -> None:
    pairs = blocks("fault-tolerance.md")
    assert len(pairs) == 3 and "srun" in pairs[2][0]  # the demos, then the cluster recipe
    run_blocks(pairs[:2], tmp_path)
    log = (tmp_path / "ft-demo.log").read_text()
    ft = [line for line in log.splitlines() if line.startswith("[ft] ")]
    assert "[ft] replica 1 died (SIGKILL); restart 1 of 3" in ft, ft
    assert sum(" rejoined from replica " in line for line in ft) == 1, ft
    # The bound, wherever in the step the kill lands: a kill during the all-reduce used to hold a
    # survivor for the whole 30 s quorum timeout; the collectives now time out after collective_timeout_s.
    assert rejoin_seconds(log)[0] <= 15.0, ft
    finals = [[json.loads(line) for line in (tmp_path / f"runs/ft-demo/replica_{i}/metrics.jsonl").read_text()
               .splitlines()][-1] for i in range(3)]
    assert [r["step"] for r in finals] == [60] * 3 and len({r["loss"] for r in finals}) == 1, finals
    diloco = [json.loads(line) for line in (tmp_path / "runs/diloco-demo/replica_0/metrics.jsonl").read_text().splitlines()]
    assert diloco[-1]["step"] == 20
