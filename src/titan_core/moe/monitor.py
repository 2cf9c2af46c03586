"""The trainer's side of MoE: the auxiliary loss into the training loss, the bias update, the metrics.

The trainer builds one :class:`MoEMonitor` over its model parts (it finds every
:class:`~titan_core.moe.MoE` block; with none it does nothing) and calls:

* :meth:`MoEMonitor.after_forward` after each micro-batch's forward, before backward: it
  returns the sum of the blocks' auxiliary losses, which the trainer adds to the loss it
  differentiates (the reported loss stays the cross-entropy), and adds the micro-batch's
  tokens per expert to the step's count;
* :meth:`MoEMonitor.after_step` after the optimizer step: the counts are summed over all
  ranks (every rank then applies the same bias update, whatever the layout), each block's
  ``expert_bias`` moves towards even load when its ``bias_update_rate`` is set, and the
  step's figures are returned for the metrics line: ``moe_aux_loss`` (the mean over
  micro-batches and ranks of the summed auxiliary losses), ``moe_load_imbalance`` (max/mean tokens per
  expert, averaged over the blocks) and ``moe_load_imbalance_max`` (the worst block).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .balance import load_imbalance, update_expert_bias
from .layer import MoE


class MoEMonitor:
    def __init__(self, model_parts: list[nn.Module]) -> None:
        self.blocks = [m for part in model_parts for m in part.modules() if isinstance(m, MoE)]
        self._counts: list[torch.Tensor | None] = [None] * len(self.blocks)
        self._aux: list[float] = []
        self.metrics: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.blocks)

    def after_forward(self) -> torch.Tensor | None:
        """The micro-batch's summed auxiliary loss (None without one); records the load."""
        total: torch.Tensor | None = None
        for i, block in enumerate(self.blocks):
            counts = block.tokens_per_expert
            if counts is not None:
                before = self._counts[i]
                self._counts[i] = counts if before is None else before + counts
                block.tokens_per_expert = None
            if block.aux_loss is not None:
                total = block.aux_loss if total is None else total + block.aux_loss
                block.aux_loss = None
        if total is not None:
            self._aux.append(float(total.detach()))
        return total

    @torch.no_grad()
    def after_step(self) -> dict[str, float]:
        """Global counts -> bias update and the step's figures; resets the step's records."""
        if not self.blocks:
            return {}
        present = [c for c in self._counts if c is not None]
        if not present:
            return {}
        stacked = torch.stack([c if c is not None else torch.zeros_like(present[0]) for c in self._counts])
        aux = torch.tensor([sum(self._aux) / len(self._aux) if self._aux else 0.0], device=stacked.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stacked)
            dist.all_reduce(aux)  # every rank's figure (equal batches: the mean of means is the mean)
            aux /= dist.get_world_size()
        for block, counts in zip(self.blocks, stacked):
            if block.bias_update_rate > 0:
                update_expert_bias(block.router.expert_bias, counts, block.bias_update_rate)
        imbalance = [load_imbalance(c) for c in stacked]
        self.metrics = {"moe_load_imbalance": sum(imbalance) / len(imbalance),
                        "moe_load_imbalance_max": max(imbalance)}
        if self._aux:
            self.metrics["moe_aux_loss"] = float(aux)
        self._counts = [None] * len(self.blocks)
        self._aux = []
        return self.metrics
