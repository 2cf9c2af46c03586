"""Expert load balance of a ``debugmoe`` (qwen3's, or ``--spec deepseek_v3``'s) trained on the built-in corpus.

Trains ``--steps`` steps with ``titan-train`` (one process, the flavor's balancing settings
unless overridden with extra ``--section.key=value`` arguments) and reads ``metrics.jsonl``:
the load imbalance (max / mean tokens per expert, averaged over the MoE layers) at step 1,
its peak, and the mean of the last 20 steps, with the worst layer's figure beside it.
Target: the last-20 mean at most 1.3 over 200 steps (the defaults: ``debugmoe`` as shipped,
the default batch of 8 x 256 tokens). ``--threads`` caps the run's compute threads (on a shared
machine, 1 keeps it from slowing everyone else; another count sums in another order, so the
figures can differ a little).

    python benchmarks/moe_balance.py [--spec deepseek_v3] [--steps 200] [--threads 1] [-- --qwen3.moe_bias_update_rate=0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET = 1.3
LAST = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", default="qwen3", help="the spec whose debugmoe flavor trains (default: qwen3)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="compute threads of the run (default: torch's)")
    parser.add_argument("extra", nargs="*", help="more titan-train arguments (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "titan_core", "--spec", args.spec, "--flavor", "debugmoe",
               f"--training.steps={args.steps}", f"--training.seed={args.seed}", "--metrics.log_freq=1",
               "--checkpoint.enable=false", f"--job.run_dir={run_dir}", *args.extra]
        env = dict(os.environ)
        if args.threads is not None:
            env["OMP_NUM_THREADS"] = str(args.threads)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"titan-train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "moe_load_imbalance" in r]
    mean = [r["moe_load_imbalance"] for r in records]
    worst = [r["moe_load_imbalance_max"] for r in records]
    peak = max(range(len(mean)), key=mean.__getitem__)
    last = statistics.mean(mean[-LAST:])
    print(f"{args.spec} debugmoe, {len(records)} steps, built-in corpus; extra arguments: {' '.join(args.extra) or 'none'}")
    print("load imbalance (max/mean tokens per expert, mean over layers; worst layer in brackets)")
    print(f"  step 1:        {mean[0]:.2f} [{worst[0]:.2f}]")
    print(f"  peak:          {mean[peak]:.2f} [{worst[peak]:.2f}] at step {int(records[peak]['step'])}")
    print(f"  last {LAST} mean:  {last:.2f} [{statistics.mean(worst[-LAST:]):.2f}]")
    print(f"  final loss:    {records[-1]['loss']:.4f}")
    print(f"target <= {TARGET}: {'met' if last <= TARGET else 'MISSED'}")


if __name__ == "__main__":
    main()
