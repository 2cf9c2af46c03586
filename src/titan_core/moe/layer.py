"""A sparse MoE block: route, dispatch tokens to their experts, compute, combine.

Dispatch sorts the (token, choice) pairs by expert so every expert's tokens are one
contiguous block (what a grouped GEMM wants); combine scales each expert output by its
router weight and adds it back to its token's row. Optional shared experts (a dense
SwiGLU every token goes through, DeepSeek-V3's ``n_shared_experts``) are added on top.
The routing itself (softmax or sigmoid scores, group-limited top-k, renormalised and
scaled weights, the balancing bias) is :class:`~titan_core.moe.router.TopKRouter`'s.

Each training forward leaves two things for the trainer (``titan_core.moe.monitor``) to
pick up: ``aux_loss``, the load-balancing loss already multiplied by its coefficient (None
when the coefficient is 0), overwritten by every forward and read before backward; and
``tokens_per_expert``, the load, added up over forwards until the monitor takes it (a
pipeline schedule runs several micro-batches' forwards before anyone can look). A forward
that runs inside backward is activation checkpointing's recompute of one already counted:
it records nothing.

Under pipeline parallelism the schedule runs forward and backward itself and only the last stage
sees a loss, so the auxiliary loss cannot be added to it. There the trainer sets
``aux_loss_in_backward`` (the factor the loss is weighted by): the block's output then carries the
auxiliary loss's gradient into backward (:class:`_AuxLossGradient`), and only its detached value is
left, summed over the micro-batches in ``aux_loss_sum`` for the figures.

Shapes (STYLE.md entry 14): ``B`` sequences, ``S`` tokens per sequence, ``T`` tokens (B x S),
``D`` model dim, ``E`` routed experts, ``K`` experts per token, ``N`` routed (token, choice)
pairs (T x K).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.torch_compat import current_graph_task_id
from .balance import load_balancing_loss
from .experts import GroupedExperts
from .router import ScoreFunc, TopKRouter


def tokens_per_expert(sorted_choices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many routing choices went to each expert, from the choices sorted by expert (int64 [experts]).

    Where each expert's block starts in the sorted list, found by binary search: the same
    figures as ``torch.bincount``, which has no deterministic CUDA kernel (it adds with
    atomics) and so stopped runs with ``training.deterministic=true``.
    """
    bounds = torch.arange(num_experts + 1, device=sorted_choices.device, dtype=sorted_choices.dtype)
    return torch.diff(torch.searchsorted(sorted_choices, bounds))


class MoE(nn.Module):
    """[B, S, D] (or [T, D]) -> the same shape, through ``top_k`` of ``num_experts`` SwiGLU experts.

    ``score_func``, ``n_group``, ``topk_group``, ``routed_scaling_factor`` and ``norm_topk_prob``
    configure the router (see :mod:`titan_core.moe.router`); the defaults route as Qwen3-MoE does.
    """

    aux_loss: torch.Tensor | None
    tokens_per_expert: torch.Tensor | None
    aux_loss_in_backward: float | None  # pipeline stages: the weight of the loss joined through the output
    aux_loss_sum: tuple[torch.Tensor, int] | None  # with aux_loss_in_backward: detached sum, micro-batches
    sequence_group: dist.ProcessGroup | None  # context parallelism: the ranks holding the rest of each sequence

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, top_k: int, *, norm_topk_prob: bool,
                 aux_loss_coeff: float = 0.0, bias_update_rate: float = 0.0,
                 shared_experts: nn.Module | None = None, score_func: ScoreFunc = "softmax", n_group: int = 1,
                 topk_group: int = 1, routed_scaling_factor: float = 1.0) -> None:
        super().__init__()
        self.router = TopKRouter(dim, num_experts, top_k, norm_topk_prob=norm_topk_prob, score_func=score_func,
                                 n_group=n_group, topk_group=topk_group,
                                 routed_scaling_factor=routed_scaling_factor)
        self.experts = GroupedExperts(dim, hidden_dim, num_experts)
        self.shared_experts = shared_experts
        self.aux_loss_coeff = aux_loss_coeff
        self.bias_update_rate = bias_update_rate
        self.aux_loss_in_backward = None
        self.sequence_group = None
        self.discard_forward_records()  # no forward has run yet: aux_loss, tokens_per_expert, aux_loss_sum unset

    def discard_forward_records(self) -> None:
        """Forget what forwards recorded (pipelining calls this after its shape-finding forward)."""
        self.aux_loss = None
        self.tokens_per_expert = None
        self.aux_loss_sum = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_TD = x.reshape(-1, shape[-1])
        weights_TK, expert_ids_TK, probs_TE = self.router(x_TD)
        top_k = expert_ids_TK.shape[-1]
        expert_ids_N = expert_ids_TK.flatten()
        # Stable sort: within an expert the tokens keep their order, so results do not
        # depend on the sort's tie-breaking.
        pair_order_N = torch.argsort(expert_ids_N, stable=True)
        num_tokens_per_expert_E = tokens_per_expert(expert_ids_N[pair_order_N], self.router.num_experts)
        token_ids_N = pair_order_N // top_k
        routed_ND = self.experts(x_TD[token_ids_N], num_tokens_per_expert_E)
        routed_ND = routed_ND * weights_TK.flatten()[pair_order_N].unsqueeze(-1)
        out_TD = torch.zeros_like(x_TD).index_add_(0, token_ids_N, routed_ND.to(x_TD.dtype))
        if self.shared_experts is not None:
            out_TD = out_TD + self.shared_experts(x_TD)
        if self.training:
            aux_loss = self._record(shape, probs_TE, expert_ids_TK, num_tokens_per_expert_E)
            if aux_loss is not None and self.aux_loss_in_backward is not None:
                out_TD = _AuxLossGradient.apply(out_TD, aux_loss, self.aux_loss_in_backward)  # type: ignore[no-untyped-call]
        return out_TD.reshape(shape)

    def _record(self, shape: torch.Size, probs_TE: torch.Tensor, expert_ids_TK: torch.Tensor,
                num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor | None:
        """Leave the step's auxiliary loss and load for the trainer (see the module's docstring); returns the
        auxiliary loss."""
        top_k = expert_ids_TK.shape[-1]
        per_sequence = (-1, shape[-2]) if len(shape) == 3 else (1, -1)  # [B, S, D], or one sequence
        # Computed in an activation-checkpointing recompute too: the recompute must save the same
        # tensors for backward as the forward did, or torch refuses it.
        aux_loss = (self.aux_loss_coeff * load_balancing_loss(probs_TE.reshape(*per_sequence, probs_TE.shape[-1]),
                                                              expert_ids_TK.reshape(*per_sequence, top_k),
                                                              sequence_group=self.sequence_group)
                    if self.aux_loss_coeff > 0 else None)
        if current_graph_task_id() == -1:  # not a recompute in backward: count the tokens once
            before = self.tokens_per_expert
            counts_E = num_tokens_per_expert_E.detach()
            self.tokens_per_expert = counts_E if before is None else before + counts_E
            if self.aux_loss_in_backward is None:
                self.aux_loss = aux_loss
            elif aux_loss is not None:
                total, count = self.aux_loss_sum or (torch.zeros_like(aux_loss), 0)
                self.aux_loss_sum = (total + aux_loss.detach(), count + 1)
        return aux_loss


class _AuxLossGradient(torch.autograd.Function):
    """The identity on a block's output whose backward also gives ``aux_loss`` the gradient ``weight``:
    the auxiliary loss trained on as if added to the loss (times ``weight``), where no one can add it."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, aux_loss: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.weight = weight
        ctx.aux_shape, ctx.aux_dtype = aux_loss.shape, aux_loss.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        aux_grad = torch.full(ctx.aux_shape, ctx.weight, dtype=ctx.aux_dtype, device=grad_out.device)
        return grad_out, aux_grad, None


def reset_routers(model: nn.Module) -> None:
    """Start every MoE router of ``model`` unbiased: the routers' part of a MoE model's ``init_buffers``
    (after ``to_empty``; a loaded checkpoint then brings its own biases)."""
    for module in model.modules():
        if isinstance(module, MoE):
            module.router.init_buffers()
