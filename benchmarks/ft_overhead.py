"""torchft's overhead with no failure: K replica groups against plain DDP over the same K processes.

Both variants train the same model on the same global batch with K processes of one rank each:
``--fault_tolerance.local_replicas=K`` (a lighthouse, a quorum every step, the gradients averaged
by torchft's process group, should_commit) and ``--nproc-per-node K --parallelism.dp_replicate=K
--parallelism.dp_shard=1`` (torch DDP). Each process gets the same thread count. The variants
alternate A/B/A/B (``--rounds``) so the machine's noise hits both alike. Printed: the median
step time of each (steps after ``--warmup``, all rounds) and the ratio torchft / DDP (the issue's
target: at most 1.10).

    python benchmarks/ft_overhead.py                         # 2 groups, debugmodel, batch 8 x 256, 3 rounds
    python benchmarks/ft_overhead.py --steps 6 --rounds 1    # a quick look
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


def step_times(run_dir: Path, warmup: int) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["step_time_s"] for r in records if "step_time_s" in r and r["step"] > warmup]


def train(run_dir: Path, args: argparse.Namespace, variant: str) -> list[float]:
    common = [sys.executable, "-m", "titan_core", "--spec", "llama3", "--flavor", "debugmodel",
              f"--llama3.n_layers={args.layers}", f"--training.seq_len={args.seq_len}",
              f"--training.local_batch_size={args.batch}", f"--training.steps={args.steps}",
              "--metrics.log_freq=1", "--metrics.report=false", f"--job.run_dir={run_dir}"]
    if variant == "torchft":
        cmd = [*common, f"--fault_tolerance.local_replicas={args.groups}"]
    else:
        cmd = [*common, f"--nproc-per-node={args.groups}", f"--parallelism.dp_replicate={args.groups}",
               "--parallelism.dp_shard=1"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    log = run_dir.parent / f"{run_dir.name}.log"
    with open(log, "w") as out:  # torchft is chatty: never an unread pipe
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        sys.exit(f"{variant} run failed (exit {rc}); see {log}")
    # Every process of a step waits for the slowest; group 0 (or DDP's rank 0) stands for the step.
    return step_times(run_dir / "replica_0" if variant == "torchft" else run_dir, args.warmup)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="sequences per process per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) // 2), help="OMP threads per process")
    args = p.parse_args()
    if args.steps <= args.warmup:
        p.error("--steps must be more than --warmup")
    times: dict[str, list[float]] = {"torchft": [], "ddp": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for variant in times:
                times[variant] += train(Path(tmp) / f"{variant}-{r}", args, variant)
    ft, ddp = statistics.median(times["torchft"]), statistics.median(times["ddp"])
    print(f"{args.groups} processes of one rank, debugmodel {args.layers} layers, batch {args.batch} x {args.seq_len} "
          f"per process, {args.threads} threads each; median over steps {args.warmup + 1}..{args.steps} of "
          f"{args.rounds} round(s)")
    print(f"{'variant':<10} {'step s':>8}")
    print(f"{'torchft':<10} {ft:>8.4f}")
    print(f"{'ddp':<10} {ddp:>8.4f}")
    print(f"step-time ratio torchft / ddp: {ft / ddp:.3f}")


if __name__ == "__main__":
    main()
