"""DiLoCo against synchronous training: the same groups, steps and data, the loss after N steps.

Two runs of the local fault-tolerance supervisor on the built-in corpus, one after the other:
``semi_sync=none`` (gradients averaged over the groups every step) and ``semi_sync=diloco``
(inner steps on each group's own share, an outer step every ``sync_steps``). Both end on a
step where every group holds the same weights; the figure compared is the validation loss of
those weights on the same held-out batches (each group scores its share of them; the mean is
printed), not a training loss (in DiLoCo that is one group's own batch, between syncs).
Printed: both losses and their ratio diloco / synchronous (the issue's bar: at most 1.02).

    python benchmarks/diloco.py                 # 2 groups, 200 steps (the figure in docs/fault-tolerance.md)
    python benchmarks/diloco.py --steps 20      # a quick look
    python benchmarks/diloco.py --seed 1        # another initialisation and data order
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import int_parser


def validation_loss(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return float([r for r in records if "val_loss" in r][-1]["val_loss"])


def train(run_dir: Path, args: argparse.Namespace, *extra: str) -> float:
    cmd = [sys.executable, "-m", "titan_core", "--spec", "llama3", "--flavor", "debugmodel",
           f"--llama3.n_layers={args.layers}", f"--training.seq_len={args.seq_len}",
           f"--training.local_batch_size={args.batch}", f"--training.steps={args.steps}",
           f"--fault_tolerance.local_replicas={args.groups}", "--validation.enable=true",
           f"--validation.freq={args.steps}", f"--validation.steps={args.val_batches}",
           "--metrics.log_freq=1000000", f"--training.seed={args.seed}", f"--job.run_dir={run_dir}", *extra]
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:  # torchft is chatty: never an unread pipe
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"{run_dir.name} run failed (exit {rc}); see {run_dir.parent / f'{run_dir.name}.log'}")
    # Each group scores its own share of the held-out batches: their mean is the loss over all of them.
    return sum(validation_loss(run_dir / f"replica_{i}") for i in range(args.groups)) / args.groups


def main() -> None:
    # --batch: sequences per group per step; --seed: training.seed of both runs
    p = int_parser(__doc__, steps=200, groups=2, layers=2, seq_len=64, batch=4, val_batches=16, seed=0)
    p.add_argument("--sync-steps", type=int, default=None, help="DiLoCo's sync_steps (default: the config's)")
    args = p.parse_args()
    diloco = ["--fault_tolerance.semi_sync=diloco"]
    if args.sync_steps is not None:
        diloco.append(f"--fault_tolerance.sync_steps={args.sync_steps}")
    with tempfile.TemporaryDirectory() as tmp:
        sync = train(Path(tmp) / "sync", args)
        semi = train(Path(tmp) / "diloco", args, *diloco)
    print(f"{args.groups} groups x {args.steps} steps, debugmodel {args.layers} layers, seq_len {args.seq_len}, "
          f"batch {args.batch} per group; validation loss on {args.val_batches} held-out batches")
    print(f"synchronous   {sync:.4f}")
    print(f"diloco        {semi:.4f}")
    print(f"ratio diloco / synchronous: {semi / sync:.4f}")


if __name__ == "__main__":
    main()
