"""Mixture-of-Experts building blocks for any TrainSpec: router, stacked experts, grouped GEMM,
balancing.

What a MoE family needs, written once: softmax or sigmoid scoring, group-limited top-k,
renormalised and scaled top-k weights, shared experts, the auxiliary-loss-free routing bias and
the optional sequence-wise auxiliary loss, and dense-first layers (:func:`is_moe_layer`).

A model puts :class:`MoE` blocks where its dense MLPs would be; the trainer finds them
(``MoEMonitor``), adds their auxiliary loss to the training loss, updates their routing
biases after each optimizer step and logs their load. Nothing here names a model.

May import ``plugin``, ``models``, ``config``, ``runtime`` and the leaves; ``parallel`` (expert
parallelism) and the model plugins use it.
"""

from .balance import load_balancing_loss, load_imbalance, update_expert_bias
from .experts import GroupedExperts
from .grouped_mm import grouped_linear, grouped_mm_available
from .layer import MoE, reset_routers
from .layers import is_moe_layer
from .monitor import MoEMonitor
from .router import SCORE_FUNCS, ScoreFunc, TopKRouter, check_routing

__all__ = [
    "SCORE_FUNCS",
    "GroupedExperts",
    "MoE",
    "MoEMonitor",
    "ScoreFunc",
    "TopKRouter",
    "check_routing",
    "grouped_linear",
    "grouped_mm_available",
    "is_moe_layer",
    "load_balancing_loss",
    "load_imbalance",
    "reset_routers",
    "update_expert_bias",
]
