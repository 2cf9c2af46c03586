"""Process group set-up from torchrun's environment, and small collectives."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime.launch_env import LAUNCHER_ENV, rank_env
from ..runtime.rendezvous import join_process_group


@dataclass(frozen=True)
class ProcessInfo:
    rank: int
    world_size: int
    backend: str
    device: torch.device

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def die_with_launcher() -> None:
    """Under torchrun, ask Linux to SIGKILL this worker when its launcher dies.

    torchrun starts each worker in its own session, so killing the launcher (a
    scheduler's SIGKILL, a closed terminal) would otherwise leave workers training
    and writing checkpoints on their own.
    """
    launched = "TORCHELASTIC_RUN_ID" in os.environ or LAUNCHER_ENV in os.environ
    if not launched or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):  # not glibc: workers simply outlive a killed launcher
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def pick_device(preference: str, local_rank: int) -> torch.device:
    """``training.device`` for the process with this local rank (``auto`` = CUDA when available)."""
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def resolve_backend(backend: str, device: torch.device) -> str:
    """``parallelism.backend`` with ``auto`` resolved: nccl on CUDA, gloo on CPU."""
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(*, backend: str, device: torch.device, init_timeout_s: float = 300.0,
                       collective_timeout_s: float = 600.0) -> ProcessInfo:
    """Init the default group when launched by torchrun; a single process needs none.

    ``backend`` and ``device`` are the run's resolved ones (``ResolvedConfig``), never ``auto``.
    """
    _, _, world_size = rank_env()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        join_process_group(backend, init_timeout_s=init_timeout_s, collective_timeout_s=collective_timeout_s)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return ProcessInfo(rank, world_size, backend, device)


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks (a copy; identity in a single process)."""
    out = value.detach().clone()
    if dist.is_initialized():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
