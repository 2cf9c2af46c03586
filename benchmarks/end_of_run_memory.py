"""Does anything after the last step raise a run's peak memory? The trainer exports and draws its
report (matplotlib) after training, in its own process; this compares the process's peak resident
memory with its resident memory at the last step line, with the report on and off.

Each run is a fresh ``titan-train`` (llama3 ``debugmodel``, selective activation checkpointing,
float32), launched alternately with ``--metrics.report=true`` and ``false``. For each run: the peak
RSS of the process (``wait4``'s ``ru_maxrss``), the ``mem`` figure of its last step line (RSS then),
and the peak above that figure. On 2026-12-06 the report added 23-26 MB above the training's own
peak, until the trainer handed the heap's freed pages back before drawing it (docs/benchmarks.md,
"Memory against torchtitan").

    python benchmarks/end_of_run_memory.py [--rounds 2] [--steps 2] [--batch 8] [--seq-len 2048]
                                           [--threads 1] [-- more titan-train flags]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import Table, int_parser

MEM = re.compile(r"^step\s+\d+ \|.*\| mem ([\d.]+)GiB", re.M)


def run(report: bool, args: argparse.Namespace, extra: list[str], folder: Path) -> tuple[float, float]:
    """(peak RSS in GiB, RSS at the last step line in GiB) of one titan-train run."""
    train = str(Path(sys.executable).with_name("titan-train"))
    command = [train, "--spec", "llama3", "--flavor", "debugmodel", f"--training.local_batch_size={args.batch}",
               f"--training.seq_len={args.seq_len}", f"--training.steps={args.steps}",
               "--activation_checkpoint.mode=selective", "--metrics.log_freq=1", f"--metrics.report={str(report).lower()}",
               f"--job.run_dir={folder}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    with tempfile.TemporaryFile(mode="w+") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if process.returncode != 0:
        raise SystemExit(f"titan-train exited {process.returncode}:\n{text[-3000:]}")
    steps = MEM.findall(text)
    if not steps:
        raise SystemExit(f"no step line with a mem figure in the output:\n{text[-3000:]}")
    return usage.ru_maxrss / 2**20, float(steps[-1])  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = int_parser(__doc__, rounds=2, steps=2, batch=8, seq_len=2048, threads=1)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    table = Table(("round", "<7"), ("report", "<8"), ("peak RSS GiB", ">14"), ("last step GiB", ">15"),
                  ("above, MB", ">11"))
    table.print_header()
    above: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_number in range(1, args.rounds + 1):
            for report in (True, False):
                folder = Path(tmp) / f"run-{round_number}-{report}"
                peak, last = run(report, args, extra, folder)
                # the mem figure has two decimals: a difference within its rounding (5 MiB) reads as 0
                extra_mb = max(0.0, (peak - last) * 1024 - 5.12)
                above[report].append(extra_mb)
                table.print_row(str(round_number), "on" if report else "off", f"{peak:.3f}", f"{last:.2f}",
                                f"{extra_mb:.0f}")
    print(f"report on: peak {statistics.median(above[True]):.0f} MB above the last step's RSS (median); "
          f"report off: {statistics.median(above[False]):.0f} MB")


if __name__ == "__main__":
    main()
