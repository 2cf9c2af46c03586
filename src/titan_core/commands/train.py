"""``titan-train`` (default command): build the Trainer and train."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import distributed, signals
from ..config.resolve import ResolvedConfig
from ..out_of_memory import out_of_memory_named
from ..peer_failure import lost_peer

if TYPE_CHECKING:
    from ..run_lock import RunLock


def _take_run_folder(run_dir: Path) -> RunLock | None:
    """Rank 0 owns the run folder for the life of the run (the --nproc-per-node launcher holds it for its workers)."""
    from ..run_lock import acquire_run_lock, lock_held_by_launcher

    rank, _, _ = distributed.rank_env()
    if rank != 0 or lock_held_by_launcher(run_dir):
        return None
    return acquire_run_lock(run_dir)


def train(resolved: ResolvedConfig) -> int:
    from ..trainer import Trainer

    distributed.die_with_launcher()
    lock = _take_run_folder(Path(resolved.config.job.run_dir))
    if resolved.config.fault_tolerance.enable:
        from ..fault_tolerance.trainer import FaultTolerantTrainer

        trainer: Trainer = FaultTolerantTrainer(resolved)
    else:
        trainer = Trainer(resolved)
    clean = False
    try:
        with signals.handlers_installed(), lost_peer(resolved.config.parallelism), \
                out_of_memory_named("while setting up, validating or saving the run"):
            trainer.setup()
            losses = trainer.train()
        if trainer.is_rank0 and losses:
            print(f"[titan] done: {len(losses)} steps this run, final loss {losses[-1]:.4f}, "
                  f"run folder {trainer.run_dir}", flush=True)
        clean = True
    finally:
        if clean or not distributed.world_size_from_env() > 1:
            distributed.destroy()
        if lock is not None:
            lock.release()
    return 0


__all__ = ["train"]
