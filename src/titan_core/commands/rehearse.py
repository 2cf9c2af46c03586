"""``titan-train --rehearse-rank R``: rank R of a cluster layout trains here (train/rehearsal.py)."""

from __future__ import annotations

from ..parallel.fake_group import fake_process_group
from ..plan.resolve import ResolvedConfig
from ..train.rehearsal import BANNER, RehearsalTrainer, check_rehearsable, claim_rehearsal_folder
from .train import train


def rehearse(resolved: ResolvedConfig, *, rank: int) -> int:
    check_rehearsable(resolved, rank=rank)
    claim_rehearsal_folder(resolved, rank=rank)
    print(f"[titan] {BANNER.format(rank=rank, world=resolved.world_size)}", flush=True)
    with fake_process_group(rank=rank, world_size=resolved.world_size):
        return train(resolved, trainer_class=RehearsalTrainer, rehearsal=True)


__all__ = ["rehearse"]
