"""``titan-train`` (default command): build the Trainer and train."""

from __future__ import annotations

from .. import distributed
from ..config.resolve import ResolvedConfig


def train(resolved: ResolvedConfig) -> int:
    from ..trainer import Trainer

    distributed.die_with_launcher()
    trainer = Trainer(resolved)
    try:
        trainer.setup()
        losses = trainer.train()
        if trainer.is_rank0 and losses:
            print(f"[titan] done: {len(losses)} steps this run, final loss {losses[-1]:.4f}, "
                  f"run folder {trainer.run_dir}", flush=True)
    finally:
        distributed.destroy()
    return 0
