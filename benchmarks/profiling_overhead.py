"""What ``[profiling]`` costs when it is off: the Trainer as shipped vs the Trainer with its
profiling calls removed.

Both variants are real ``titan-train`` runs of the llama3 debugmodel on one process (fp32,
the same seed and batch). The baseline imports a module (``--import``, written to a temporary
folder) that replaces ``StepProfiler.phase``, ``before_step`` and ``after_step`` with bare
functions, i.e. the Trainer as if it had no profiling code. The runs alternate A/B/A/B so
machine noise hits both alike; each run's steady-state step time is the median of
``step_time_s`` in metrics.jsonl over steps after the first three. Printed: both medians and
the ratio shipped / baseline (target <= 1.03).

    python benchmarks/profiling_overhead.py                 # 3 rounds of 30 steps
    python benchmarks/profiling_overhead.py --rounds 1 --steps 15
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import int_parser

STUB = r'''
import contextlib
from titan_core.observability.profiling import StepProfiler


_null = contextlib.nullcontext()
StepProfiler.phase = lambda self, name: _null
StepProfiler.before_step = lambda self, step: None
StepProfiler.after_step = lambda self, step, *, last: None
'''


def step_time(tmp: Path, variant: str, index: int, steps: int, seq_len: int) -> float:
    run_dir = tmp / f"{variant}-{index}"
    imports = ["--import", "no_profiling_calls"] if variant == "baseline" else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "titan_core", *imports, "--spec", "llama3", "--flavor", "debugmodel",
           f"--training.steps={steps}", f"--training.seq_len={seq_len}", "--training.local_batch_size=4",
           "--metrics.log_freq=1", f"--job.run_dir={run_dir}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["step_time_s"] for r in records if "loss" in r and r["step"] > 3)


def main() -> None:
    parser = int_parser(__doc__, rounds=3, steps=30, seq_len=256)
    args = parser.parse_args()
    if args.steps < 4:
        parser.error(f"--steps {args.steps}: give at least 4 (the first three steps are warm-up, left out)")
    times: dict[str, list[float]] = {"shipped": [], "baseline": []}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "no_profiling_calls.py").write_text(STUB)
        for i in range(args.rounds):
            for variant in ("shipped", "baseline"):
                times[variant].append(step_time(tmp, variant, i, args.steps, args.seq_len))
    shipped, baseline = statistics.median(times["shipped"]), statistics.median(times["baseline"])
    print(f"profiling off, llama3 debugmodel, 1 process, seq_len {args.seq_len}, {args.rounds} x {args.steps} steps")
    print(f"shipped Trainer (profiling.enable=false): {shipped * 1000:8.2f} ms/step")
    print(f"profiling calls removed:                  {baseline * 1000:8.2f} ms/step")
    ratio = shipped / baseline
    print(f"overhead ratio: {ratio:.3f} (target <= 1.03)")
    print(json.dumps({"shipped_s": shipped, "baseline_s": baseline, "ratio": ratio}))


if __name__ == "__main__":
    main()
