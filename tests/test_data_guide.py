"""docs/data.md runs as written: its bash blocks, in order, in an empty folder, with the installed tools."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

GUIDE = REPO / "docs" / "data.md"


def test_every_command_of_the_data_guide_runs_and_does_what_it_says(tmp_path: Path) -> None:
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 3
    bin_dir = str(Path(sys.executable).parent)  # titan-train and titan-data of this environment
    env = {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(blocks)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    index = json.loads((tmp_path / "shards/python/index.json").read_text())
    assert index["num_documents"] == 218 and index["num_tokens"] > 1_000_000 and index["dtype"] == "uint16"
    assert "train with --data.source=tokens:shards/python" in proc.stdout
    for run in ("shards", "mix"):
        records = [json.loads(line) for line in (tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [1, 3, 6] and all(r["data_ms"] >= 0 for r in records)
    last = records[-1]
    assert last["tokens_seen.python"] + last["tokens_seen.notes"] == last["tokens_seen"] == 6 * 2 * 64
    assert "| tokens python " in proc.stdout and "| data " in proc.stdout
    # the mix's split, as the page quotes it: 12 rows of 64 tokens by the deficit rule, 8 python and 4 notes
    assert "(`tokens python 512 notes 256`)" in GUIDE.read_text() and "| tokens python 512 notes 256" in proc.stdout
