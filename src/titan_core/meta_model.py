"""A spec's model built on the meta device: its structure and shapes, no memory.

Every path that builds a model starts here: the Trainer and ``--dry-run`` (through
``build.py``), the checks of an HF folder's shapes, the readers of a checkpoint's model
args, ``titan-convert`` and the conformance kit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .protocols import TrainSpec


def meta_model(spec: TrainSpec, model_args: object) -> nn.Module:
    """``spec.model_cls(model_args)`` on the meta device (no parameter holds data)."""
    with torch.device("meta"):
        model: nn.Module = spec.model_cls(model_args)
    return model
