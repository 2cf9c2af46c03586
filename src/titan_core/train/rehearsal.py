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

The run folder is a rehearsal's own (``rehearsal.json`` marks it): a rehearsal refuses a folder
holding a training run's files (its checkpoints would be replaced by one rank's shards, its
metrics set aside), and a real run refuses a rehearsal's folder (runtime/folder_locks.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import ConfigError
from ..observability.metrics import memory_stats
from ..plan.resolve import ResolvedConfig
from ..runtime.folder_kinds import REHEARSAL_MARKER, is_rehearsal_folder
from ..runtime.run_files import SUPERSEDED_FILE, atomic_write_text
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


#: what a training run writes into its run folder (config.toml at its start; metrics from its first step)
RUN_FILES = ("config.toml", "metrics.jsonl", SUPERSEDED_FILE)


def claim_rehearsal_folder(resolved: ResolvedConfig, *, rank: int) -> None:
    """Mark the run folder as a rehearsal's, creating it; ConfigError, writing nothing, for a folder holding a
    training run's files (other files, such as a script's console log, may sit beside a rehearsal)."""
    run_dir = Path(resolved.config.job.run_dir).expanduser()
    if run_dir.is_dir() and not is_rehearsal_folder(run_dir):
        checkpoints = run_dir / resolved.config.checkpoint.folder
        try:
            held = [name for name in RUN_FILES if (run_dir / name).exists()]
            if checkpoints.is_dir() and any(checkpoints.iterdir()):
                held.append(f"{resolved.config.checkpoint.folder}/")
        except OSError as exc:
            raise ConfigError(f"cannot read the run folder {run_dir}: {exc.strerror or exc}. Give the rehearsal a "
                              f"folder of its own (--job.run_dir=runs/NAME-rehearsal).") from None
        if held:
            raise ConfigError(
                f"--rehearse-rank {rank}: the run folder {run_dir} holds a training run's files ({', '.join(held)}). "
                f"A rehearsal saves one rank's checkpoint shards and its own metrics there, which would replace the "
                f"run's and break its resume. Give the rehearsal a folder of its own, e.g. "
                f"--job.run_dir={run_dir}-rehearsal.")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / REHEARSAL_MARKER, json.dumps(
            {"rehearsal": {"rank": rank, "world_size": resolved.world_size}}, indent=2) + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write the run folder {run_dir}: {exc.strerror or exc}. Point --job.run_dir at "
                          f"a writable folder.") from None


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


__all__ = ["BANNER", "RehearsalTrainer", "check_rehearsable", "claim_rehearsal_folder"]
