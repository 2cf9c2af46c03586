"""Will the model fit? A lower bound checked before any weight is allocated.

Per rank: float32 weights + float32 gradients + the optimizer's float32 state
(AdamW/Adam: two moments; SGD here: none) and, with ``[ema]``, the float32 EMA of the weights, divided by the degree the parameters are
split over (dp_shard x tp x pp; dp_replicate copies them). Activations come on top,
so a run refused here could never have trained, and one accepted may still need more.
Available memory: MemAvailable of this machine shared by its local ranks on CPU, the
free memory of the rank's GPU on CUDA.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ..errors import ConfigError

__all__ = ["MemoryEstimate", "available_bytes", "check_model_fits", "estimate"]

WEIGHT_AND_GRAD_BYTES = 4 + 4
OPTIMIZER_STATE_BYTES = {"AdamW": 8, "Adam": 8, "SGD": 0}
EMA_BYTES = 4
GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    n_params: int
    bytes_per_param: int
    split: int

    @property
    def total(self) -> int:
        return self.n_params * self.bytes_per_param

    @property
    def per_rank(self) -> int:
        return math.ceil(self.n_params / self.split) * self.bytes_per_param


def estimate(n_params: int, *, optimizer: str, split: int, ema: bool = False) -> MemoryEstimate:
    per_param = WEIGHT_AND_GRAD_BYTES + OPTIMIZER_STATE_BYTES.get(optimizer, 8) + (EMA_BYTES if ema else 0)
    return MemoryEstimate(n_params, per_param, max(split, 1))


def _mem_available_cpu() -> int | None:
    try:
        for line in open("/proc/meminfo", encoding="ascii"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes(device: torch.device, *, local_ranks: int) -> int | None:
    """Memory one rank may use, or None when it cannot be read (then nothing is refused)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    total = _mem_available_cpu()
    return None if total is None else total // max(local_ranks, 1)


def local_ranks_from_env(default: int = 1) -> int:
    """How many ranks share this machine: LOCAL_WORLD_SIZE (torchrun), else WORLD_SIZE, else ``default``."""
    raw = os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "")).strip()
    try:
        return max(int(raw), 1) if raw else max(default, 1)
    except ValueError:
        return max(default, 1)


def check_model_fits(n_params: int, *, optimizer: str, dp_shard: int, tp: int, pp: int,
                     device: torch.device, local_ranks: int | None = None, ema: bool = False) -> None:
    """ConfigError with the figures, and what would fit, when the lower bound exceeds the memory.

    ``local_ranks`` (ranks sharing this machine's memory) defaults to the launcher's environment;
    ``--dry-run`` runs before any launcher and passes the world size it plans for.
    """
    local_ranks = local_ranks or local_ranks_from_env()
    have = available_bytes(device, local_ranks=local_ranks)
    need = estimate(n_params, optimizer=optimizer, split=dp_shard * tp * pp, ema=ema)
    if have is None or need.per_rank <= have:
        return
    where = "free on this GPU" if device.type == "cuda" else f"available per rank ({local_ranks} on this machine)"
    if device.type == "cuda":
        per_device = have
    else:  # ranks on one machine share its memory: only more machines add room
        per_device = have * local_ranks
    shards = math.ceil(need.total / per_device)
    fits = (f"split the parameters over at least {shards} "
            f"{'GPUs' if device.type == 'cuda' else 'machines like this one'} "
            f"(dp_shard x tp x pp >= {shards}, e.g. --parallelism.dp_shard={shards})")
    raise ConfigError(
        f"the model cannot fit: {n_params:,} parameters need at least {need.per_rank / GIB:,.1f} GiB per rank "
        f"(float32 weights + gradients + {optimizer} state{' + EMA' if ema else ''} = {need.bytes_per_param} bytes "
        f"per parameter, split "
        f"{need.split} way{'s' if need.split != 1 else ''} by dp_shard={dp_shard} x tp={tp} x pp={pp}; "
        f"activations come on top) but only {have / GIB:,.1f} GiB is {where}. Use a smaller model or flavor, "
        f"or {fits}."
    )
