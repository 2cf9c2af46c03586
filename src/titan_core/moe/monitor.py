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
  combined over the stages, so every rank reports all blocks. There the schedule runs backward
  itself, and the blocks join their auxiliary losses to it through their outputs
  (``aux_loss_in_backward``, see :mod:`titan_core.moe.layer`): ``after_forward`` is not called.

Nothing here reads a device value on the host except :attr:`MoEMonitor.metrics`, which the
trainer reads on logging steps only: the auxiliary losses, the load counts, the bias update
and the figures stay on the device (a host read waits for the GPU to finish the step). The
figures also say which path the experts took: ``moe_grouped_mm`` is the share of blocks whose
last forward ran ``torch._grouped_mm`` (1.0: all of them; 0.0: the per-expert loop), and the
console line names it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .balance import update_expert_bias
from .layer import MoE


class MoEMonitor:
    """``group``: the ranks whose tokens the counts add up over (None: every rank; ranks that
    hold other pipeline stages must be left out: their blocks are other layers).
    ``stage_group``: the pipeline ranks the figures are combined over (None: no pipeline).
    ``aux_loss_in_backward``: pipeline stages, the weight of the auxiliary losses joined to backward.
    ``sequence_group``: context parallelism, the ranks holding the rest of each sequence."""

    def __init__(self, model_parts: list[nn.Module], *, group: dist.ProcessGroup | None = None,
                 stage_group: dist.ProcessGroup | None = None, aux_loss_in_backward: float | None = None,
                 sequence_group: dist.ProcessGroup | None = None) -> None:
        self.blocks = [m for part in model_parts for m in part.modules() if isinstance(m, MoE)]
        for block in self.blocks:  # pipeline stages: the weight of each block's auxiliary loss in backward
            block.aux_loss_in_backward = aux_loss_in_backward
            block.sequence_group = sequence_group  # context parallelism (balance.load_balancing_loss)
        self.group = group
        self.stage_group = stage_group
        self._any_blocks = bool(self.blocks)
        joining = aux_loss_in_backward is not None and any(block.aux_loss_coeff > 0 for block in self.blocks)
        if stage_group is not None and dist.is_available() and dist.is_initialized():
            # Pipeline ranks hold different blocks: the model has MoE blocks (with an auxiliary loss) if any
            # stage does (asked once, so a dense model's steps cost no collective).
            found = torch.tensor([len(self.blocks), joining], dtype=torch.float64, device=_collective_device(stage_group))
            dist.all_reduce(found, group=stage_group)
            self._any_blocks, joining = bool(found[0].item()), bool(found[1].item())
        self._joins_aux = joining  # every rank alike: whether the stages' figures include an auxiliary loss
        self._counts: list[torch.Tensor | None] = [None] * len(self.blocks)
        self._aux: list[torch.Tensor] = []
        self._figures: dict[str, torch.Tensor] = {}  # the last step's figures, on the device
        self._read: dict[str, float] = {}

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

    def drop_forward(self) -> None:
        """Forget what the last forward left in the blocks (its loads and auxiliary loss): a forward that trains
        nothing, such as QK-clip's measuring forward, must not count in the step's loads or the next loss."""
        for block in self.blocks:
            block.tokens_per_expert = None
            block.aux_loss = None
            block.aux_loss_sum = None

    def after_forward(self) -> torch.Tensor | None:
        """The micro-batch's summed auxiliary loss (None without one); records the load."""
        total: torch.Tensor | None = None
        self._take_counts()
        for block in self.blocks:
            if block.aux_loss is not None:
                total = block.aux_loss if total is None else total + block.aux_loss
                block.aux_loss = None
        if total is not None:
            self._aux.append(total.detach())
        return total

    @torch.no_grad()
    def step_counts(self) -> torch.Tensor | None:
        """This step's tokens per expert, [blocks, experts], summed over ``group``; None when this rank holds no
        MoE block. For a caller that combines them further before the bias update (fault tolerance averages
        them over the replica groups, so that every group moves its routing biases alike) and hands them
        back to :meth:`after_step` through ``counts``."""
        self._take_counts()
        present = [c for c in self._counts if c is not None]
        if not present:
            return None
        stacked = torch.stack([c if c is not None else torch.zeros_like(present[0]) for c in self._counts])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stacked, group=self.group)
        self._counts = [None] * len(self.blocks)
        return stacked

    @torch.no_grad()
    def after_step(self, *, read: bool = True, counts: torch.Tensor | None = None) -> dict[str, float]:
        """Global counts -> bias update and the step's figures; resets the step's records.

        ``counts``: what :meth:`step_counts` returned, combined further by the caller (default: taken here).
        Returns the figures read on the host, or, with ``read=False`` (the trainer, every step),
        nothing: they stay on the device until :attr:`metrics` is read."""
        if not self.enabled:
            return {}
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        stacked = counts if counts is not None else self.step_counts()
        device = stacked.device if stacked is not None else _collective_device(self.stage_group)
        # [sum of the blocks' imbalances, number of blocks], and the worst block's imbalance
        summed = torch.zeros(2, dtype=torch.float64, device=device)
        worst = torch.zeros(1, dtype=torch.float64, device=device)
        aux = torch.zeros(1, device=device)
        # Auxiliary losses joined through the blocks' outputs (pipeline stages): each block's mean over the
        # micro-batches, summed over this stage's blocks here and over the stages below.
        joined = [block.aux_loss_sum for block in self.blocks if block.aux_loss_sum is not None]
        for block in self.blocks:
            block.aux_loss_sum = None
        if stacked is not None:
            if self._aux:
                aux = torch.stack(self._aux).float().mean().reshape(1)
            elif joined:
                aux = sum((total.float() / count for total, count in joined), torch.zeros((), device=device)).reshape(1)
            if distributed:
                dist.all_reduce(aux, group=self.group)  # every rank's figure (equal batches: the mean of means)
                aux /= dist.get_world_size(self.group)
            for block, block_counts in zip(self.blocks, stacked):
                if block.bias_update_rate > 0:
                    update_expert_bias(block.router.expert_bias, block_counts, block.bias_update_rate)
            imbalance = load_imbalances(stacked)
            summed = torch.stack([imbalance.sum(), torch.tensor(float(len(imbalance)), dtype=torch.float64,
                                                                device=device)])
            worst = imbalance.max().reshape(1)
        if distributed and self.stage_group is not None:
            # Every pipeline rank joins, also one whose stages hold no MoE block.
            on = _collective_device(self.stage_group)
            summed, worst, aux = summed.to(on), worst.to(on), aux.to(on)
            dist.all_reduce(summed, group=self.stage_group)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=self.stage_group)
            if self._joins_aux:
                dist.all_reduce(aux, group=self.stage_group)
        self._figures = {"moe_load_imbalance": summed[0] / summed[1].clamp(min=1), "moe_load_imbalance_max": worst[0],
                         "blocks": summed[1]}
        if self._aux or self._joins_aux:
            self._figures["moe_aux_loss"] = aux[0]
        self._read = {}
        self._counts = [None] * len(self.blocks)
        self._aux = []
        return self.metrics if read else {}

    @property
    def metrics(self) -> dict[str, float]:
        """The last step's figures, read on the host (the first read waits for the device)."""
        if self._figures and not self._read:
            values = {name: float(v) for name, v in self._figures.items()}
            if values.pop("blocks") > 0:
                self._read = values
                paths = [block.experts.last_path for block in self.blocks if block.experts.last_path]
                if paths:
                    self._read["moe_grouped_mm"] = paths.count("grouped_mm") / len(paths)
        return self._read


def load_imbalances(counts: torch.Tensor) -> torch.Tensor:
    """max / mean tokens per expert of each row of ``counts`` [blocks, experts], float64 on the device; 1.0
    where nothing was routed."""
    load = counts.to(torch.float64)
    mean = load.mean(-1)
    return torch.where(mean > 0, load.max(-1).values / mean.clamp(min=1e-300), torch.ones_like(mean))


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where a tensor for a collective on ``group`` must live (nccl: this rank's GPU)."""
    if group is not None and dist.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
