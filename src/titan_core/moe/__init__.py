"""Mixture-of-Experts building blocks for any TrainSpec: router, stacked experts, grouped GEMM,
balancing.

A model puts :class:`MoE` blocks where its dense MLPs would be; the trainer finds them
(``MoEMonitor``), adds their auxiliary loss to the training loss, updates their routing
biases after each optimizer step and logs their load. Nothing here names a model.

May import ``plugin``, ``models``, ``config``, ``runtime`` and the leaves; ``parallel`` (expert
parallelism) and the model plugins use it.
"""

from .balance import load_balancing_loss, load_imbalance, update_expert_bias
from .experts import GroupedExperts
from .grouped_mm import grouped_linear, grouped_mm_available
from .layer import MoE
from .monitor import MoEMonitor
from .router import TopKRouter

__all__ = [
    "GroupedExperts",
    "MoE",
    "MoEMonitor",
    "TopKRouter",
    "grouped_linear",
    "grouped_mm_available",
    "load_balancing_loss",
    "load_imbalance",
    "update_expert_bias",
]
