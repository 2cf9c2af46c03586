"""scripts/gpu: the prepared GPU checks must at least parse, and their summary must read runs right.
(The checks themselves need a GPU; `CHECKS_ON_CPU=1` runs them on a CPU by hand, see docs/benchmarks.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def write_run(root: Path, name: str, rc: int, steps: list[tuple[float, float, float]], *, sub: str = "") -> None:
    run = root / name
    (run / sub).mkdir(parents=True, exist_ok=True)
    (run / "rc").write_text(f"{rc}\n")
    (run / "console.txt").write_text("step 1 | ...\nRuntimeError: boom\n" if rc else "done\n")
    records = [{"step": i + 1, "loss": loss, "step_time_s": t, "tokens_per_s": 8192 / t, "mfu": mfu,
                "mem_max_allocated_gib": 10.0 + i} for i, (loss, t, mfu) in enumerate(steps)]
    (run / sub / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_check_script_is_valid_bash() -> None:
    for script in ("checks.sh", "fetch_wheels.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu" / script)]).returncode == 0, script


def test_summary_medians_after_warmup_ratios_and_compare_gap(tmp_path: Path) -> None:
    warm = [(9.0, 5.0, 0.01)] * 3  # left out of the medians
    write_run(tmp_path, "bf16_1B", 0, warm + [(8.0, 0.2, 0.40), (7.9, 0.2, 0.40), (7.8, 0.3, 0.30)])
    write_run(tmp_path, "float8_tensorwise_1B", 0, warm + [(8.0, 0.1, 0.80)] * 3)
    write_run(tmp_path, "float8_mx_as_typed", 2, [])
    write_run(tmp_path, "float8_compare", 0, [(9.0, 1.0, 0.1), (8.0, 1.0, 0.1)], sub="converted")
    (tmp_path / "float8_compare" / "compare.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"run": "converted", "step": 1, "loss": 9.0}, {"run": "converted", "step": 2, "loss": 8.0},
        {"run": "baseline", "step": 1, "loss": 9.0}, {"run": "baseline", "step": 2, "loss": 7.9}]))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "summarize.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert rows["bf16_1B"] == "| bf16_1B | 0 | 6 | 9 | 7.8 | 0.2 | 4.096e+04 | 0.4 | 15 |  |"
    assert rows["float8_tensorwise_1B"].startswith("| float8_tensorwise_1B | 0 | 6 | 9 | 8 | 0.1 | 8.192e+04 | 0.8 |")
    # a failed run shows its exit code and the last line it printed
    assert rows["float8_mx_as_typed"] == "| float8_mx_as_typed | 2 | 0 | - | - | - | - | - | - | RuntimeError: boom |"
    assert rows["float8_compare"].startswith("| float8_compare | 0 | 2 | 9 | 8 |")
    assert "- float8_tensorwise_1B: tokens/s 2.000x of bf16_1B" in out
    assert f"- float8_compare: step 2 loss 8.0000 vs baseline 7.9000, relative gap {0.1 / 7.9:.2e}" in out
