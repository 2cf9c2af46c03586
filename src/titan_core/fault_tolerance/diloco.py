"""DiLoCo (semi-synchronous training): local inner steps, an outer step every ``sync_steps``.

Each group trains on its own share with its own optimizer (no gradient all-reduce). Every
``sync_steps`` steps the groups average their pseudo-gradient (the weights at the last sync
minus the weights now) over the live groups, and an outer SGD (Nesterov when it has momentum)
moves the last-sync weights by it; every group then holds the same weights again.

:class:`OuterState` is the checkpoint's ``diloco`` entry: the last-sync ("anchor") weights, the
outer momentum and the step of the last sync, so a run stopped between two syncs resumes exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..checkpoint.states import laid_out_like, optimizers_of
from ..errors import CheckpointError
from ..optim.param_groups import clean_name
from .shards import local

DILOCO = "diloco"  # the checkpoint's top-level key (part of the on-disk format)


class OuterStep:
    """The last-sync weights and the outer optimizer over them."""

    def __init__(self, model_parts: list[nn.Module], *, lr: float, momentum: float, sync_steps: int) -> None:
        named = [(clean_name(n), p) for part in model_parts for n, p in part.named_parameters()]
        self.names = [n for n, _ in named]
        self.full = [p for _, p in named]  # DTensors under FSDP2/TP: the checkpoint keeps their layout
        self.params = [local(p) for p in self.full]
        self.anchor = [p.detach().clone() for p in self.params]
        for a in self.anchor:
            a.grad = torch.zeros_like(a)
        self.optimizer = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=momentum > 0)
        self.sync_steps = sync_steps
        self.synced_at = 0  # the step whose weights the anchor holds
        self.loaded = False  # set when a checkpoint or a live peer gave the anchor

    def restart_from_model(self, step: int) -> None:
        """At the first step, unless a checkpoint or a peer gave the outer state: the model's weights
        (fresh, initial_load, or a checkpoint of a run without DiLoCo) are the last-sync weights."""
        if self.loaded:
            return
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                a.copy_(p)
        self.synced_at = step

    def pseudo_gradients(self) -> list[torch.Tensor]:
        """Last-sync weights minus the weights now, one tensor per parameter (averaged by the caller)."""
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                assert a.grad is not None
                a.grad.copy_(a - p.detach())
        return [a.grad for a in self.anchor if a.grad is not None]

    def step(self, step: int) -> None:
        """Outer step on the last-sync weights with the averaged pseudo-gradients; the model takes them."""
        self.optimizer.step()
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params):
                p.copy_(a)
        self.synced_at = step

    def momentum_buffers(self) -> list[torch.Tensor | None]:
        return [self.optimizer.state.get(a, {}).get("momentum_buffer") for a in self.anchor]

    # ---- the state a live peer sends (local shards; see shards.py) -------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"anchor": [a.detach() for a in self.anchor], "optimizer": self.optimizer.state_dict(),
                "synced_at": self.synced_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for a, saved in zip(self.anchor, state["anchor"]):
                a.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.synced_at = int(state["synced_at"])
        self.loaded = True


def inner_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The inner optimizer's per-parameter state tensors (Adam's two moments), local shards, in an order
    every group shares (parameter groups' order, then the state's keys sorted; not the scalar step)."""
    tensors = []
    for opt in optimizers_of(optimizer):
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p, {})
                tensors += [local(state[k]) for k in sorted(state)
                            if isinstance(state[k], torch.Tensor) and state[k].dim() > 0 and state[k].is_floating_point()]
    return tensors


class OuterState:
    """The checkpoint's ``diloco`` entry (a ``Stateful``): tensors only, each checked on load.

    ``anchor.<fqn>`` and ``momentum.<fqn>`` are laid out like the parameter (DTensors under
    FSDP2/TP, so DCP saves each rank's shard); a zero momentum is the same as none (SGD's first
    momentum step takes the gradient as it is)."""

    # A checkpoint of a run without DiLoCo resumes too: the outer state then starts from its weights.
    optional_in_checkpoint = True

    def __init__(self, outer: OuterStep) -> None:
        self.outer = outer

    def _like_param(self, i: int, value: torch.Tensor) -> torch.Tensor:
        return laid_out_like(self.outer.full[i], value)

    def state_dict(self) -> dict[str, Any]:
        o = self.outer
        state: dict[str, Any] = {"synced_at": torch.tensor(o.synced_at, dtype=torch.int64),
                                 "sync_steps": torch.tensor(o.sync_steps, dtype=torch.int64)}
        for i, (name, a, buf) in enumerate(zip(o.names, o.anchor, o.momentum_buffers())):
            state[f"anchor.{name}"] = self._like_param(i, a.detach())
            state[f"momentum.{name}"] = self._like_param(i, buf.detach() if buf is not None else torch.zeros_like(a))
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        o = self.outer
        values = {k: _checked(state_dict, k, like=a) for n, a in zip(o.names, o.anchor)
                  for k in (f"anchor.{n}", f"momentum.{n}")}
        synced_at = int(_checked(state_dict, "synced_at", like=torch.tensor(0, dtype=torch.int64)))
        sync_steps = int(_checked(state_dict, "sync_steps", like=torch.tensor(0, dtype=torch.int64)))
        if sync_steps < 1 or synced_at < 0:
            raise CheckpointError(f"the checkpoint's DiLoCo state is damaged (sync_steps={sync_steps}, "
                                  f"synced_at={synced_at}); resume from another checkpoint.")
        if sync_steps != o.sync_steps:
            raise CheckpointError(
                f"the checkpoint was written by a DiLoCo run with fault_tolerance.sync_steps={sync_steps}, this run "
                f"has {o.sync_steps}; resume with --fault_tolerance.sync_steps={sync_steps}.")
        with torch.no_grad():
            for name, a in zip(o.names, o.anchor):
                a.copy_(values[f"anchor.{name}"])
                buf = values[f"momentum.{name}"]
                if o.optimizer.defaults["momentum"] > 0:
                    o.optimizer.state[a] = {"momentum_buffer": buf.clone()}
        o.synced_at = synced_at
        o.loaded = True


def _checked(state: dict[str, Any], key: str, *, like: torch.Tensor) -> torch.Tensor:
    """``state[key]`` as a local tensor shaped like ``like``, finite; else one message."""
    value = state.get(key)
    value = local(value) if isinstance(value, torch.Tensor) else value
    if not isinstance(value, torch.Tensor) or value.shape != like.shape or value.dtype != like.dtype:
        got = f"{value.dtype}{list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise CheckpointError(
            f"the checkpoint's DiLoCo state {DILOCO}.{key} is {got}, expected {like.dtype}{list(like.shape)}: it is "
            "damaged or from another model; resume from another checkpoint or start fresh with "
            "--checkpoint.resume=never.")
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise CheckpointError(f"the checkpoint's DiLoCo state {DILOCO}.{key} holds NaN or inf; resume from another "
                              "checkpoint or start fresh with --checkpoint.resume=never.")
    return value
