"""A spec's model built on the meta device: its structure and shapes, no memory.

Every path that builds a model starts here: the Trainer and ``--dry-run`` (through
``build.py``), the checks of an HF folder's shapes, the readers of a checkpoint's model
args, ``titan-convert`` and the conformance kit. The constructor is plugin code, so it
runs through the plugin facade (guarded, its result checked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..runtime.meta_construction import NoRandomFillsOnMeta
from .plugin_boundary import SpecCalls

if TYPE_CHECKING:
    from ..plugin.protocols import TrainSpec


def meta_model(spec: TrainSpec | SpecCalls, model_args: object) -> nn.Module:
    """``spec.model_cls(model_args)`` on the meta device (no parameter holds data)."""
    calls = spec if isinstance(spec, SpecCalls) else SpecCalls(spec)
    with torch.device("meta"), NoRandomFillsOnMeta():
        return calls.build_model(model_args)
