"""Rehearsal: one real rank of a cluster layout, trained in this process under torch's fake process group.

``titan-train --rehearse-rank R --nnodes N --nproc-per-node M ...`` builds, shards and steps the
model exactly as rank R of the N x M-rank job would (its shards, its memory, its kernels), with a
fake process group whose collectives move nothing. What crosses ranks is garbage by design, so
losses and gradient norms are not the real run's and the finite checks are off; the figures worth
reading are the step time and the peak memory, printed at the end.

Pipeline layouts are rehearsed with static stage shapes (parallel/pipeline.py's
``static_stage_args``: torch's stages would otherwise learn them from their neighbours at the first
step, through collectives that here return nothing). A checkpoint save writes rank R's own shards,
with no collective (checkpoint/manager.py's ``lone_rank``): ``step-N`` holds ``__R_0.distcp``, the
index of its tensors and the identity record; the other ranks' files do not exist, so
``checkpoint.resume=auto`` never resumes in a rehearsal (it starts fresh). This process is
the only one, so it prints what rank 0 prints and writes the run folder whatever R is.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..observability.metrics import memory_stats
from ..plan.resolve import ResolvedConfig
from .memory_plan import check_plannable
from .trainer import StepResult, Trainer

BANNER = ("rehearsal: rank {rank} of {world} under torch's fake process group: collectives move nothing, so "
          "losses and gradient norms are not the real run's; finite checks are off")


def check_rehearsable(resolved: ResolvedConfig, *, rank: int) -> None:
    """ConfigError for what rehearsal cannot run yet, before anything is built."""
    c, dims = resolved.config, resolved.dims
    if not 0 <= rank < dims.world_size:
        raise ConfigError(f"--rehearse-rank {rank}: the layout has ranks 0 to {dims.world_size - 1} "
                          f"(--nnodes x --nproc-per-node).")
    if c.fault_tolerance.enable or c.fault_tolerance.local_replicas:
        raise ConfigError("--rehearse-rank rehearses one rank of one job: turn fault_tolerance off.")
    check_plannable(dims.dp_shard * dims.cp)  # FSDP2's set-up cuts each weight into one piece per shard rank


class RehearsalTrainer(Trainer):
    """The Trainer with the checks that read collective values turned off, saving rank R's shards alone."""

    def init_distributed(self) -> None:
        super().init_distributed()
        self.is_rank0 = True  # the only process: it logs the steps and writes the run folder, whichever rank it is
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def build_checkpointer(self) -> None:
        if self.config.checkpoint.resume == "auto":
            # A rehearsal's checkpoints hold one rank's shards: no run (nor rehearsal) resumes from them.
            self.config.checkpoint.resume = "never"
        super().build_checkpointer()

    def checkpoint_lone_rank(self) -> tuple[int, int] | None:
        return self.proc.rank, self.proc.world_size

    def check_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> StepResult | None:
        return None  # the values that crossed ranks are the fake group's

    def stop_if_nonfinite_since_last_read(self) -> None:
        return None

    def finish(self) -> None:
        super().finish()
        stats = memory_stats(self.device)
        peak = stats.get("mem_max_allocated_gib", stats.get("mem_peak_rss_gib", 0.0))
        kind = "allocated on the GPU" if "mem_max_allocated_gib" in stats else "resident (RSS)"
        print(f"[titan] rehearsal done: {self.step} steps on rank {self.proc.rank} of {self.proc.world_size}, "
              f"peak memory {peak:.2f} GiB {kind}", flush=True)


__all__ = ["BANNER", "RehearsalTrainer", "check_rehearsable"]
