"""The trainer's side of the terms a model adds to its own loss (``titan_core.models.loss_terms``).

After each micro-batch's forward the trainer takes every pending :class:`LossTerm` and adds the
sum to the loss it differentiates; after the optimizer step the reported figures are averaged
over the micro-batches and the token ranks (one all-reduce a step, only for a model that has terms)
and kept on the device until a logging step reads them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..models.loss_terms import LossTerm


class LossTermCollector:
    """``group``: the ranks whose tokens differ (data-parallel x context-parallel); None: every rank."""

    def __init__(self, model_parts: list[nn.Module], *, device: torch.device, group: Any = None) -> None:
        self.terms = [m for part in model_parts for m in part.modules() if isinstance(m, LossTerm)]
        self.group = group
        self.device = device
        self.names = sorted({term.metric for term in self.terms})
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._figures: torch.Tensor | None = None
        self._read: dict[str, float] = {}

    def after_forward(self) -> torch.Tensor | None:
        """The micro-batch's summed terms (None when the forward added none); records the reported figures."""
        total: torch.Tensor | None = None
        for term in self.terms:
            pending = term.take()
            if pending is None:
                continue
            value, reported = pending
            total = value if total is None else total + value
            before = self._sums.get(term.metric)
            self._sums[term.metric] = reported.float() if before is None else before + reported.float()
            self._counts[term.metric] = self._counts.get(term.metric, 0) + 1
        return total

    def drop_pending(self) -> None:
        """Forget the terms of a forward that trains nothing (QK-clip's measuring forward)."""
        for term in self.terms:
            term.take()

    @torch.no_grad()
    def after_step(self) -> None:
        """Average this step's figures over its micro-batches and the token ranks; reset for the next step.
        Every rank joins the all-reduce whenever the model has terms, also one whose forwards added none."""
        if not self.terms:
            return
        zero = torch.zeros((), device=self.device)
        sums = torch.stack([self._sums.get(name, zero).to(self.device) for name in self.names])
        counts = torch.tensor([float(self._counts.get(name, 0)) for name in self.names], device=self.device)
        both = torch.cat([sums, counts])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(both, group=self.group)
        sums, counts = both.split(len(self.names))
        # NaN for a figure no forward reported this step; it is left out of the metrics.
        self._figures = torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan")))
        self._read = {}
        self._sums, self._counts = {}, {}

    @property
    def metrics(self) -> dict[str, float]:
        """The last step's figures by metric name, read on the host (the first read waits for the device)."""
        if self._figures is not None and not self._read:
            self._read = {name: value for name, value in zip(self.names, self._figures.tolist())
                          if value == value}  # NaN: not reported this step
        return self._read
