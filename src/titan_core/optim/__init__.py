"""The optimizer: containers that step every model part's optimizer and LR scheduler as one
(``containers``), the parameter groups (``param_groups``: weight decay, per-group settings) and
the settings torch's optimizers refuse, checked before a run starts (``settings``).

May import ``config``, ``plugin``, ``models``, ``runtime`` and the leaves; nothing above.
``from titan_core.optim import OptimizersContainer`` keeps working (the module this package
replaced).
"""

from .containers import LRSchedulersContainer, OptimizersContainer, decay_curve, lr_multiplier

__all__ = ["LRSchedulersContainer", "OptimizersContainer", "decay_curve", "lr_multiplier"]
