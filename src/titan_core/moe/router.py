"""The top-k router: which experts each token goes to, and with what weight.

Two scorings, one router:

* ``score_func="softmax"`` (Qwen3-MoE, Mixtral): softmax over all experts, in float32;
* ``score_func="sigmoid"`` (DeepSeek-V3, Kimi K2, Moonlight): an independent sigmoid per expert.

Then, in order: optionally only the ``topk_group`` best of ``n_group`` equal groups of experts
stay candidates (group-limited routing, DeepSeek-V3: a group's score is the sum of its two best
experts' scores); the ``top_k`` best candidates are chosen; their weights are the unbiased scores
of the chosen experts, optionally renormalised to sum to 1 (``norm_topk_prob``), then multiplied
by ``routed_scaling_factor``. Every step is the one transformers' Qwen3-MoE and DeepSeek-V3
routers take, in the same order, so loaded checkpoints route the same tokens with the same weights.

An ``expert_bias`` (the auxiliary-loss-free balancing of DeepSeek-V3) shifts only the *choice*
of experts (group scores included), never the weights the chosen experts' outputs are mixed
with; it is a persistent buffer, so a resumed run picks the same experts, and
:func:`titan_core.moe.balance.update_expert_bias` moves it after each optimizer step.

Where the bias is added depends on the scoring. Sigmoid: to the scores, as DeepSeek-V3 defines
it and as its checkpoints hold it (``e_score_correction_bias``). Softmax: to the logits, not
the probabilities: once the router prefers a few experts, the others' probabilities are tiny and
nearly equal for every token, so a bias step of fixed size in probability space moves all their
tokens at once (the load then flips between two experts step after step); in logit space the
tokens' spread does not shrink with the probability. With a zero bias the choice is the same
either way, so Hugging Face's routing is unchanged.

The third output, ``probs_TE``, is what the sequence-wise auxiliary loss weighs the load with:
the softmax probabilities, or the sigmoid scores normalised to sum to 1 per token (DeepSeek-V3's
form of that loss).

Shapes (STYLE.md entry 14): ``T`` tokens, ``D`` model dim, ``E`` routed experts, ``K`` experts
per token (``top_k``), ``G`` expert groups (``n_group``), ``P`` experts per group (E / G).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

ScoreFunc = Literal["softmax", "sigmoid"]
SCORE_FUNCS: tuple[str, ...] = ("softmax", "sigmoid")


class TopKRouter(nn.Module):
    """Token states ``x_TD`` -> (weights_TK, expert_ids_TK, probs_TE)."""

    expert_bias: torch.Tensor

    def __init__(self, dim: int, num_experts: int, top_k: int, *, norm_topk_prob: bool,
                 score_func: ScoreFunc = "softmax", n_group: int = 1, topk_group: int = 1,
                 routed_scaling_factor: float = 1.0) -> None:
        super().__init__()
        check_routing(num_experts, top_k, score_func=score_func, n_group=n_group, topk_group=topk_group)
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.score_func = score_func
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(num_experts, dtype=torch.float32), persistent=True)

    def forward(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits_TE = self.gate(x_TD).float()
        if self.score_func == "sigmoid":
            scores_TE = torch.sigmoid(logits_TE)
            choice_TE = scores_TE + self.expert_bias
            probs_TE = scores_TE / scores_TE.sum(dim=-1, keepdim=True)
        else:
            scores_TE = probs_TE = F.softmax(logits_TE, dim=-1)
            choice_TE = logits_TE + self.expert_bias
        if self.n_group > 1:
            choice_TE = self._keep_best_groups(choice_TE)
        # The bias only ranks the experts (no gradient flows through the choice anyway).
        expert_ids_TK = torch.topk(choice_TE, self.top_k, dim=-1).indices
        weights_TK = scores_TE.gather(-1, expert_ids_TK)
        if self.norm_topk_prob:
            # The tiny term keeps all-zero sigmoid scores finite; it is below float32's resolution for
            # any real sum (a softmax top-k sums to at least K/E), so softmax weights are unchanged.
            weights_TK = weights_TK / (weights_TK.sum(dim=-1, keepdim=True) + 1e-20)
        if self.routed_scaling_factor != 1.0:
            weights_TK = weights_TK * self.routed_scaling_factor
        return weights_TK.to(x_TD.dtype), expert_ids_TK, probs_TE

    def _keep_best_groups(self, choice_TE: torch.Tensor) -> torch.Tensor:
        """``choice_TE`` with every expert outside its token's ``topk_group`` best groups at -inf."""
        tokens = choice_TE.shape[0]
        per_group = self.num_experts // self.n_group
        choice_TGP = choice_TE.view(tokens, self.n_group, per_group)
        group_scores_TG = choice_TGP.topk(min(2, per_group), dim=-1).values.sum(dim=-1)
        best_groups_Tg = torch.topk(group_scores_TG, self.topk_group, dim=-1).indices
        keep_TG = torch.zeros_like(group_scores_TG, dtype=torch.bool).scatter_(1, best_groups_Tg, True)
        keep_TE = keep_TG.unsqueeze(-1).expand(tokens, self.n_group, per_group).reshape(tokens, self.num_experts)
        return choice_TE.masked_fill(~keep_TE, float("-inf"))

    def init_buffers(self) -> None:
        """A fresh (not loaded) router starts unbiased."""
        self.expert_bias.zero_()


def check_routing(num_experts: int, top_k: int, *, score_func: str = "softmax", n_group: int = 1,
                  topk_group: int = 1) -> None:
    """ValueError naming the setting when these routing settings cannot work together."""
    if score_func not in SCORE_FUNCS:
        raise ValueError(f"TopKRouter: score_func={score_func!r} is not one of {', '.join(SCORE_FUNCS)}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"TopKRouter: top_k={top_k} must be between 1 and num_experts={num_experts}")
    if n_group < 1 or num_experts % n_group:
        raise ValueError(f"TopKRouter: n_group={n_group} must be 1 or more and divide num_experts={num_experts} "
                         f"(experts are split into equal groups)")
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"TopKRouter: topk_group={topk_group} must be between 1 and n_group={n_group}")
    if top_k > topk_group * (num_experts // n_group):
        raise ValueError(f"TopKRouter: top_k={top_k} is more than the {topk_group * (num_experts // n_group)} experts "
                         f"of the topk_group={topk_group} groups a token may use (n_group={n_group}, "
                         f"{num_experts // n_group} experts each)")
