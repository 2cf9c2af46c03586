"""A sparse MoE block: route, dispatch tokens to their experts, compute, combine.

Dispatch sorts the (token, choice) pairs by expert so every expert's tokens are one
contiguous block (what a grouped GEMM wants); combine scales each expert output by its
router weight and adds it back to its token's row. Optional shared experts (a dense
SwiGLU every token goes through) are added on top.

Each training forward leaves two things for the trainer (``titan_core.moe.monitor``) to
pick up: ``aux_loss``, the load-balancing loss already multiplied by its coefficient (None
when the coefficient is 0), overwritten by every forward and read before backward; and
``tokens_per_expert``, the load, added up over forwards until the monitor takes it (a
pipeline schedule runs several micro-batches' forwards before anyone can look). A forward
that runs inside backward is activation checkpointing's recompute of one already counted:
it records nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from .balance import load_balancing_loss
from .experts import GroupedExperts
from .router import TopKRouter


def tokens_per_expert(sorted_choices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many routing choices went to each expert, from the choices sorted by expert (int64 [experts]).

    Where each expert's block starts in the sorted list, found by binary search: the same
    figures as ``torch.bincount``, which has no deterministic CUDA kernel (it adds with
    atomics) and so stopped runs with ``training.deterministic=true``.
    """
    bounds = torch.arange(num_experts + 1, device=sorted_choices.device, dtype=sorted_choices.dtype)
    return torch.diff(torch.searchsorted(sorted_choices, bounds))


class MoE(nn.Module):
    """[batch, seq, dim] -> [batch, seq, dim] through ``top_k`` of ``num_experts`` SwiGLU experts."""

    aux_loss: torch.Tensor | None
    tokens_per_expert: torch.Tensor | None

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, top_k: int, *, norm_topk_prob: bool,
                 aux_loss_coeff: float = 0.0, bias_update_rate: float = 0.0,
                 shared_experts: nn.Module | None = None) -> None:
        super().__init__()
        self.router = TopKRouter(dim, num_experts, top_k, norm_topk_prob=norm_topk_prob)
        self.experts = GroupedExperts(dim, hidden_dim, num_experts)
        self.shared_experts = shared_experts
        self.aux_loss_coeff = aux_loss_coeff
        self.bias_update_rate = bias_update_rate
        self.aux_loss = None
        self.tokens_per_expert = None

    def discard_forward_records(self) -> None:
        """Forget what forwards recorded (pipelining calls this after its shape-finding forward)."""
        self.aux_loss = None
        self.tokens_per_expert = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, experts, probs = self.router(flat)
        top_k = experts.shape[-1]
        choices = experts.flatten()
        # Stable sort: within an expert the tokens keep their order, so results do not
        # depend on the sort's tie-breaking.
        order = torch.argsort(choices, stable=True)
        counts = tokens_per_expert(choices[order], self.router.num_experts)
        token_of = order // top_k
        out = self.experts(flat[token_of], counts) * weights.flatten()[order].unsqueeze(-1)
        combined = torch.zeros_like(flat).index_add_(0, token_of, out.to(flat.dtype))
        if self.shared_experts is not None:
            combined = combined + self.shared_experts(flat)
        if self.training:
            per_sequence = (-1, shape[-2]) if len(shape) == 3 else (1, -1)  # [batch, seq, dim], or one sequence
            # Computed in an activation-checkpointing recompute too: the recompute must save the same
            # tensors for backward as the forward did, or torch refuses it.
            aux_loss = (self.aux_loss_coeff * load_balancing_loss(probs.reshape(*per_sequence, probs.shape[-1]),
                                                                  experts.reshape(*per_sequence, top_k))
                        if self.aux_loss_coeff > 0 else None)
            if torch._C._current_graph_task_id() == -1:  # not a recompute in backward: count the tokens once
                before = self.tokens_per_expert
                self.tokens_per_expert = counts.detach() if before is None else before + counts.detach()
                self.aux_loss = aux_loss
        return combined.reshape(shape)
