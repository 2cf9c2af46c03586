"""Settings this machine cannot honour, refused before anything starts (dry run and run alike)."""

from __future__ import annotations

import importlib.util

from ..errors import ConfigError
from .job import JobConfig

__all__ = ["check_environment"]


def check_environment(config: JobConfig) -> None:
    """``metrics.wandb`` without wandb installed; ``training.device=cuda`` without a usable GPU."""
    if config.metrics.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "metrics.wandb=true but the wandb package is not installed. Install it (pip install wandb) or "
            "drop --metrics.wandb (metrics.jsonl in the run folder records every step either way)."
        )
    if config.training.device == "cuda" or config.parallelism.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            setting = "training.device=cuda" if config.training.device == "cuda" else "parallelism.backend=nccl"
            raise ConfigError(
                f"{setting} but this machine has no usable CUDA device (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'none'}). Use --training.device=auto (or cpu) and "
                f"--parallelism.backend=auto, or run on a machine with a GPU."
            )
