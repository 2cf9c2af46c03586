"""Process group set-up from torchrun's environment, and small collectives."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):  # not glibc: workers simply outlive a killed launcher
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def world_size_from_env() -> int:
    """The world size torchrun announced (1 outside torchrun): known before any process group."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_process_group(*, backend: str, device_preference: str) -> ProcessInfo:
    """Init the default group when launched by torchrun; a single process needs none."""
    world_size = world_size_from_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_preference, local_rank)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend)
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
