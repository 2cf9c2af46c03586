"""Load balancing of experts: the auxiliary loss, DeepSeek-V3's bias update, and the load figures.

* :func:`load_balancing_loss`: Switch-Transformer style, ``E * sum_e f_e * P_e`` with
  ``f_e`` the share of routing choices that went to expert e and ``P_e`` its mean router
  probability; 1.0 when perfectly even. It has a gradient through ``P`` only.
* :func:`update_expert_bias`: the auxiliary-loss-free method (DeepSeek-V3, section 2.1.2):
  after each optimizer step every expert's routing bias moves by ``rate`` towards even
  load (up when under-loaded, down when over-loaded), then the biases are re-centred.
* :func:`load_imbalance`: max / mean tokens per expert (1.0 is perfectly even).
"""

from __future__ import annotations

import torch


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """The auxiliary loss of one layer (not yet multiplied by its coefficient)."""
    num_experts = probs.shape[-1]
    share = counts.to(probs.dtype) / max(probs.shape[0] * top_k, 1)
    return num_experts * (share * probs.mean(0)).sum()


@torch.no_grad()
def update_expert_bias(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> None:
    """Move ``bias`` (in place) by ``rate`` towards even load, given the step's ``counts``."""
    load = counts.to(torch.float32)
    bias.add_(rate * torch.sign(load.mean() - load))
    bias.sub_(bias.mean())


def load_imbalance(counts: torch.Tensor) -> float:
    """max / mean tokens per expert; 1.0 when even (and when nothing was routed)."""
    load = counts.to(torch.float64)
    mean = float(load.mean())
    return float(load.max()) / mean if mean > 0 else 1.0
