"""What ``metrics.layer_stats`` costs: the step time with it against without, at ``metrics.log_freq=10``.

Both variants are real ``titan-train`` runs of the llama3 debugmodel on one process (fp32, the same seed
and batch), alternating A/B/A/B so machine noise hits both alike. Each run's ``step_time_s`` records are
means over their logging window (ten steps, the measured logging step among them); a run's figure is the
median of its records after the first (start-up). Printed: both medians and the ratio with / without
(target <= 1.03).

    python benchmarks/layer_stats.py                 # 3 rounds of 60 steps
    python benchmarks/layer_stats.py --rounds 1 --steps 30
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import Table, int_parser

LOG_FREQ = 10


def step_time(tmp: Path, variant: str, index: int, steps: int, seq_len: int) -> float:
    run_dir = tmp / f"{variant}-{index}"
    cmd = [sys.executable, "-m", "titan_core", "--spec", "llama3", "--flavor", "debugmodel",
           f"--training.steps={steps}", f"--training.seq_len={seq_len}", "--training.local_batch_size=4",
           f"--metrics.log_freq={LOG_FREQ}", "--metrics.report=false", f"--job.run_dir={run_dir}",
           f"--metrics.layer_stats={'true' if variant == 'with' else 'false'}"]
    proc = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "loss" in r and r["step"] > 1 and r["step"] % LOG_FREQ == 0]
    if variant == "with" and not any(k.startswith("layer/") for k in windows[-1]):
        raise SystemExit("the run with metrics.layer_stats=true recorded no layer/* figures")
    return statistics.median(r["step_time_s"] for r in windows[1:] or windows)


def main() -> None:
    parser = int_parser(__doc__, rounds=3, steps=60, seq_len=256)
    args = parser.parse_args()
    if args.steps < 3 * LOG_FREQ:
        parser.error(f"--steps {args.steps}: give at least {3 * LOG_FREQ} (three logging windows of {LOG_FREQ})")
    times: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as name:
        for i in range(args.rounds):
            for variant in ("without", "with"):
                times[variant].append(step_time(Path(name), variant, i, args.steps, args.seq_len))
    without, with_stats = statistics.median(times["without"]), statistics.median(times["with"])
    print(f"metrics.layer_stats at log_freq {LOG_FREQ}, llama3 debugmodel, 1 process, seq_len {args.seq_len}, "
          f"{args.rounds} x {args.steps} steps")
    table = Table(("layer_stats", "<14"), ("ms/step", ">10"))
    table.print_header()
    table.print_row("off", f"{without * 1000:.2f}")
    table.print_row("on", f"{with_stats * 1000:.2f}")
    ratio = with_stats / without
    print(f"step-time ratio with / without: {ratio:.3f} (target <= 1.03)")
    print(json.dumps({"without_s": without, "with_s": with_stats, "ratio": ratio}))


if __name__ == "__main__":
    main()
