"""DiLoCo (semi-synchronous training): local inner steps, an outer step every ``sync_steps``.

Each group trains on its own share with its own optimizer (no gradient all-reduce). Every
``sync_steps`` steps the groups average their pseudo-gradient (the weights at the last sync
minus the weights now) over the live groups, and an outer SGD with Nesterov momentum
moves the last-sync weights by it; every group then holds the same weights again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .shards import local


class OuterStep:
    """The last-sync weights and the outer optimizer over them."""

    def __init__(self, model_parts: list[nn.Module], *, lr: float, momentum: float) -> None:
        self.params = [local(p) for part in model_parts for p in part.parameters()]
        self.anchor = [p.detach().clone() for p in self.params]
        for a in self.anchor:
            a.grad = torch.zeros_like(a)
        self.optimizer = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=momentum > 0)

    def restart_from_model(self) -> None:
        """After a resume or an initial load the model's weights are the last-sync weights (the outer
        momentum is not in checkpoints: it starts again from zero)."""
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                a.copy_(p)

    def pseudo_gradients(self) -> list[torch.Tensor]:
        """Last-sync weights minus the weights now, one tensor per parameter (averaged by the caller)."""
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                assert a.grad is not None
                a.grad.copy_(a - p.detach())
        return [a.grad for a in self.anchor if a.grad is not None]

    def step(self) -> None:
        """Outer step on the last-sync weights with the averaged pseudo-gradients; the model takes them."""
        self.optimizer.step()
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                p.copy_(a)

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": [a.detach() for a in self.anchor], "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for a, saved in zip(self.anchor, state["anchor"]):
                a.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
