"""The trainer's side of MoE: the auxiliary loss into the training loss, the bias update, the metrics.

The trainer builds one :class:`MoEMonitor` over its model parts (it finds every
:class:`~titan_core.moe.MoE` block; with none it does nothing) and calls:

* :meth:`MoEMonitor.after_forward` after each micro-batch's forward, before backward: it
  returns the sum of the blocks' auxiliary losses, which the trainer adds to the loss it
  differentiates (the reported loss stays the cross-entropy), and adds the micro-batch's
  tokens per expert to the step's count;
* :meth:`MoEMonitor.after_step` after the optimizer step: the counts (with those a pipeline
  schedule's forwards left in the blocks) are summed over the data-parallel ranks
  (``group``; every rank then applies the same bias update, whatever the layout), each block's
  ``expert_bias`` moves towards even load when its ``bias_update_rate`` is set, and the
  step's figures are returned for the metrics line: ``moe_aux_loss`` (the mean over
  micro-batches and ranks of the summed auxiliary losses), ``moe_load_imbalance`` (max/mean tokens per
  expert, averaged over the blocks) and ``moe_load_imbalance_max`` (the worst block). With
  pipeline stages (``stage_group``) each rank holds some of the blocks: the figures are
  combined over the stages, so every rank reports all blocks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .balance import load_imbalance, update_expert_bias
from .layer import MoE


class MoEMonitor:
    """``group``: the ranks whose tokens the counts add up over (None: every rank; ranks that
    hold other pipeline stages must be left out: their blocks are other layers).
    ``stage_group``: the pipeline ranks the figures are combined over (None: no pipeline)."""

    def __init__(self, model_parts: list[nn.Module], *, group: dist.ProcessGroup | None = None,
                 stage_group: dist.ProcessGroup | None = None) -> None:
        self.blocks = [m for part in model_parts for m in part.modules() if isinstance(m, MoE)]
        self.group = group
        self.stage_group = stage_group
        self._any_blocks = bool(self.blocks)
        if stage_group is not None and dist.is_available() and dist.is_initialized():
            # Pipeline ranks hold different blocks: the model has MoE blocks if any stage does
            # (asked once, so a dense model's steps cost no collective).
            found = torch.tensor([len(self.blocks)], dtype=torch.float64, device=_collective_device(stage_group))
            dist.all_reduce(found, group=stage_group)
            self._any_blocks = bool(found.item())
        self._counts: list[torch.Tensor | None] = [None] * len(self.blocks)
        self._aux: list[float] = []
        self.metrics: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        """Whether the model (any of its pipeline stages) has MoE blocks."""
        return self._any_blocks

    def _take_counts(self) -> None:
        """Move the load the blocks recorded since the last call into the step's count."""
        for i, block in enumerate(self.blocks):
            counts = block.tokens_per_expert
            if counts is not None:
                before = self._counts[i]
                self._counts[i] = counts if before is None else before + counts
                block.tokens_per_expert = None

    def after_forward(self) -> torch.Tensor | None:
        """The micro-batch's summed auxiliary loss (None without one); records the load."""
        total: torch.Tensor | None = None
        self._take_counts()
        for block in self.blocks:
            if block.aux_loss is not None:
                total = block.aux_loss if total is None else total + block.aux_loss
                block.aux_loss = None
        if total is not None:
            self._aux.append(float(total.detach()))
        return total

    @torch.no_grad()
    def after_step(self) -> dict[str, float]:
        """Global counts -> bias update and the step's figures; resets the step's records."""
        if not self.enabled:
            return {}
        self._take_counts()
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        present = [c for c in self._counts if c is not None]
        total, n_blocks, worst = 0.0, 0, 0.0
        aux = torch.zeros(1, device=_collective_device(self.stage_group))
        if present:
            stacked = torch.stack([c if c is not None else torch.zeros_like(present[0]) for c in self._counts])
            aux = torch.tensor([sum(self._aux) / len(self._aux) if self._aux else 0.0], device=stacked.device)
            if distributed:
                dist.all_reduce(stacked, group=self.group)
                dist.all_reduce(aux, group=self.group)  # every rank's figure (equal batches: the mean of means)
                aux /= dist.get_world_size(self.group)
            for block, counts in zip(self.blocks, stacked):
                if block.bias_update_rate > 0:
                    update_expert_bias(block.router.expert_bias, counts, block.bias_update_rate)
            imbalance = [load_imbalance(c) for c in stacked]
            total, n_blocks, worst = sum(imbalance), len(imbalance), max(imbalance)
        if distributed and self.stage_group is not None:
            # Every pipeline rank joins, also one whose stages hold no MoE block.
            summed = torch.tensor([total, float(n_blocks)], dtype=torch.float64, device=aux.device)
            peak = torch.tensor([worst], dtype=torch.float64, device=aux.device)
            dist.all_reduce(summed, group=self.stage_group)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=self.stage_group)
            total, n_blocks, worst = float(summed[0]), int(summed[1]), float(peak[0])
        if n_blocks == 0:
            return {}
        self.metrics = {"moe_load_imbalance": total / n_blocks, "moe_load_imbalance_max": worst}
        if self._aux:
            self.metrics["moe_aux_loss"] = float(aux)
        self._counts = [None] * len(self.blocks)
        self._aux = []
        return self.metrics


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where a tensor for a collective on ``group`` must live (nccl: this rank's GPU)."""
    if group is not None and dist.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
