"""Muon against AdamW, each at its best learning rate from a small sweep: the validation loss after N steps.

Every run trains Llama 3's debugmodel, shortened to ``--layers`` layers, on the built-in corpus
with the same seed, data order, warmup and cosine schedule. Only the optimizer and the peak
learning rate change. The figure compared is the validation loss after the last step, on the
same held-out batches for every run (a training loss is one batch's). For each optimizer, its
best learning rate is the one with the lowest of those losses; the last line gives the ratio of
the two best losses (below 1: Muon ends lower).

    python benchmarks/muon.py                          # 300 steps, 2 layers, 3 learning rates each
    python benchmarks/muon.py --steps 30 --lrs 3e-3    # a quick look
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import Table, int_parser


def validation_loss(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return float([r for r in records if "val_loss" in r][-1]["val_loss"])


def train(run_dir: Path, optimizer: str, lr: float, *, steps: int, layers: int, seq_len: int, batch: int,
          val_batches: int) -> float:
    cmd = [sys.executable, "-m", "titan_core", "--spec", "llama3", "--flavor", "debugmodel",
           f"--llama3.n_layers={layers}", f"--training.seq_len={seq_len}", f"--training.local_batch_size={batch}",
           f"--training.steps={steps}", f"--optimizer.name={optimizer}", f"--optimizer.lr={lr}",
           "--validation.enable=true", f"--validation.freq={steps}", f"--validation.steps={val_batches}",
           "--metrics.log_freq=1000000", "--metrics.report=false", f"--job.run_dir={run_dir}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{optimizer} at lr {lr} failed:\n{done.stderr[-2000:]}")
    return validation_loss(run_dir)


def main() -> int:
    parser = int_parser(__doc__, steps=300, layers=2, seq_len=64, batch=4, val_batches=4)
    parser.add_argument("--lrs", default="1e-3,3e-3,1e-2", help="peak learning rates tried for each optimizer")
    parser.add_argument("--optimizers", default="AdamW,Muon")
    args = parser.parse_args()
    lrs = [float(lr) for lr in args.lrs.split(",")]
    table = Table(("optimizer", "<10"), ("lr", ">10"), ("val loss", ">10"), ("best", ">6"))
    table.print_header()
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for optimizer in args.optimizers.split(","):
            losses = {lr: train(Path(tmp) / f"{optimizer}-{lr}", optimizer, lr, steps=args.steps, layers=args.layers,
                                seq_len=args.seq_len, batch=args.batch, val_batches=args.val_batches) for lr in lrs}
            best[optimizer] = min(losses.values())
            for lr, loss in losses.items():
                table.print_row(optimizer, f"{lr:g}", f"{loss:.4f}", "<-" if loss == best[optimizer] else "")
    if {"AdamW", "Muon"} <= set(best):
        print(f"best Muon / best AdamW validation loss: {best['Muon'] / best['AdamW']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
