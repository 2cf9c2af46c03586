"""The top-k softmax router: which experts each token goes to, and with what weight.

Softmax over all experts (in float32), the k best per token, optionally renormalised to
sum to 1 (``norm_topk_prob``, as Qwen3-MoE does). An ``expert_bias`` (DeepSeek-V3's
auxiliary-loss-free balancing) shifts only the *choice* of experts, never the weights the
chosen experts' outputs are mixed with; it is a persistent buffer, so a resumed run picks
the same experts, and :func:`titan_core.moe.balance.update_expert_bias` moves it after
each optimizer step.

The bias is added to the router's logits, not to the softmax probabilities: once the router
prefers a few experts, the others' probabilities are tiny and nearly equal for every token,
so a bias step of fixed size in probability space moves all their tokens at once (the load
then flips between two experts step after step); in logit space the tokens' spread does not
shrink with the probability. With a zero bias the choice is the same either way (softmax is
monotonic), so Hugging Face's routing is unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TopKRouter(nn.Module):
    """Token states [tokens, dim] -> (weights [tokens, k], expert ids [tokens, k], probs [tokens, experts])."""

    expert_bias: torch.Tensor

    def __init__(self, dim: int, num_experts: int, top_k: int, *, norm_topk_prob: bool) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"TopKRouter: top_k={top_k} must be between 1 and num_experts={num_experts}")
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32), persistent=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.gate(x).float()
        probs = F.softmax(logits, dim=-1)
        # The bias only ranks the experts (no gradient flows through the choice anyway).
        _, experts = torch.topk(logits + self.expert_bias, self.top_k, dim=-1)
        weights = probs.gather(-1, experts)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts, probs

    def init_buffers(self) -> None:
        """A fresh (not loaded) router starts unbiased."""
        self.expert_bias.zero_()
