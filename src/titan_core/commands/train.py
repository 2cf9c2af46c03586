"""``titan-train`` (default command): build the Trainer and train."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StopRequested, Terminated
from ..observability.final_loss import final_loss
from ..parallel import distributed
from ..plan.resolve import ResolvedConfig
from ..runtime import signals
from ..runtime.folder_locks import acquire_run_folders
from ..runtime.launch_env import rank_env, world_size_from_env
from ..runtime.out_of_memory import out_of_memory_named
from ..runtime.peer_failure import lost_peer
from ..runtime.run_lock import lock_held_by_launcher
from ..train.trainer import Trainer
from .trainer_class import trainer_for_run

if TYPE_CHECKING:
    from ..runtime.folder_locks import HeldFolders


def _take_run_folders(resolved: ResolvedConfig, *, rehearsal: bool) -> HeldFolders | None:
    """Rank 0 owns the folders the run writes for the life of the run (the --nproc-per-node launcher holds
    them for its workers)."""

    rank, _, _ = rank_env()
    if rank != 0 or lock_held_by_launcher(Path(resolved.config.job.run_dir)):
        return None
    return acquire_run_folders(resolved.config, rehearsal=rehearsal)


def trained(trainer: Trainer) -> list[float]:
    """``trainer.setup()`` then ``trainer.train()``. Until the first step (set-up, the resume's load, the run's
    files) a SIGTERM stops the run at once: nothing is trained yet, so nothing is lost, and a long
    initialisation or a blocking read would otherwise outlast a scheduler's grace period. From the first
    step on it is honoured at the step boundary (``stop_vote``), with a checkpoint when configured."""
    try:
        with signals.sigterm_stops_at_once():
            trainer.setup()
        return trainer.train()
    except Terminated:
        raise StopRequested("titan-train: stopped by SIGTERM while setting the run up, before its first step; "
                            "nothing new to save", signum=signal.SIGTERM, quiet=rank_env()[0] != 0) from None


def train(resolved: ResolvedConfig, *, trainer_class: type[Trainer] | None = None, rehearsal: bool = False) -> int:
    """Train with ``trainer_class`` (``--trainer``; default the Trainer, or with fault tolerance its own);
    ``rehearsal``: the run is ``--rehearse-rank``'s, in a rehearsal's own folder."""
    distributed.die_with_launcher()
    cls = trainer_for_run(trainer_class, fault_tolerant=resolved.config.fault_tolerance.enable)
    lock = _take_run_folders(resolved, rehearsal=rehearsal)
    trainer = cls(resolved)
    clean = False
    try:
        with signals.handlers_installed(), lost_peer(resolved.config.parallelism), \
                out_of_memory_named("while setting up, validating or saving the run"):
            losses = trained(trainer)
        if trainer.is_rank0 and losses:
            ending = final_loss(losses)
            assert ending is not None
            print(f"[titan] done: {len(losses)} steps this run, final loss {ending.describe()}, "
                  f"run folder {trainer.run_dir}", flush=True)
        clean = True
    finally:
        if clean or not world_size_from_env() > 1:
            distributed.destroy()
        if lock is not None:
            lock.release()
    return 0


__all__ = ["train", "trained"]
