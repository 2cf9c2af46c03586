"""The do-nothing converter the misbehaving test plugins (``_hostile_plugins``, ``_survey_plugins``,
``_hardening_plugins``) start from: each replaces one method with one that fails."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel

from titan_core import ModelConverter


class QuietConverter(ModelConverter):
    """Selects one attention projection and converts nothing."""

    class Config(BaseModel):
        pass

    def __init__(self, config: Any, *, parallel_dims: Any, job: Any) -> None:
        self.config = config

    def select(self, model: torch.nn.Module) -> list[str]:
        return ["layers.0.attention.wq"]

    def convert(self, model: torch.nn.Module, fqns: list[str]) -> None:
        pass
