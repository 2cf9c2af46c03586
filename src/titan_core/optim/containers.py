"""Optimizers and LR schedulers over all model parts, stepped as one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..config.sections import LRSchedulerSection, OptimizerSection
from ..console import progress
from ..runtime.launch_env import rank_env
from .muon import Muon
from .param_groups import torch_groups

_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "AdamW": torch.optim.AdamW,
    "Adam": torch.optim.Adam,
    "SGD": torch.optim.SGD,
    "Muon": Muon,
}


class OptimizersContainer(torch.optim.Optimizer):
    """One optimizer per model part, behaving as a single ``torch.optim.Optimizer``.

    One inner optimizer per part keeps each part's (possibly differently sharded)
    parameters together, which is what DCP's optimizer state dicts expect; the
    container's ``param_groups`` are the inner groups, so an LR scheduler built on
    the container drives all of them. Parameters with ``requires_grad=False`` are
    left out (frozen embeddings, converter buffers registered as parameters).
    Step hooks registered on the container (converters' pre/post hooks) run once per
    step, around all inner steps.
    """

    def __init__(self, model_parts: list[nn.Module], config: OptimizerSection, *, device_type: str) -> None:
        cls = _OPTIMIZERS[config.name]
        kwargs: dict[str, Any] = {"lr": config.lr, "weight_decay": config.weight_decay}
        if config.name == "Muon":  # its own loop over the parameters: no kernel choice
            kwargs.update(betas=config.betas, eps=config.eps, momentum=config.muon_momentum,
                          nesterov=config.muon_nesterov, ns_steps=config.muon_ns_steps)
        elif config.name != "SGD":
            kwargs.update(betas=config.betas, eps=config.eps)
            impl = config.implementation
            if impl == "auto":
                impl = "fused" if device_type == "cuda" else "foreach"
            mixed = _mixes_dtensor_and_plain(model_parts)
            if mixed and impl != "for-loop":
                # Fused and foreach kernels refuse a list mixing DTensors with plain tensors, which a
                # TP plan that leaves some parameters whole (norms, embeddings) produces.
                progress(f"optimizer: the {impl} {config.name} kernels cannot take DTensor and plain parameters "
                         "in one list (this layout has both): using the for-loop implementation",
                         is_rank0=rank_env()[0] == 0)
            if impl == "fused" and not mixed:
                kwargs["fused"] = True
            else:
                kwargs["foreach"] = impl == "foreach" and not mixed
        self.model_parts = model_parts
        # Groups per part: weight decay and LR multiplier by role (param_groups.py).
        self.optimizers = [cls(torch_groups(part, config), **kwargs) for part in model_parts]
        params = [p for opt in self.optimizers for g in opt.param_groups for p in g["params"]]
        super().__init__(params, dict(kwargs))
        # The container's groups ARE the inner groups: changing lr here changes it there.
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {f"part{i}": opt.state_dict() for i, opt in enumerate(self.optimizers)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for i, opt in enumerate(self.optimizers):
            opt.load_state_dict(state_dict[f"part{i}"])


def lr_multiplier(step: int, *, warmup: int, total: int, config: LRSchedulerSection) -> float:
    """LR factor for ``step`` (0-based optimizer steps): linear warmup, then the decay."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    floor = config.min_lr_factor
    decay_steps = total - warmup
    if config.decay_type == "constant" or decay_steps <= 0:
        return 1.0
    if config.decay_type == "wsd":
        decay_len = max(1, int(round(config.decay_ratio * decay_steps)))
        start = total - decay_len
        if step < start:
            return 1.0
        return decay_curve(min(1.0, (step - start) / decay_len), shape=config.wsd_decay_shape, floor=floor)
    progress = min(1.0, (step - warmup) / decay_steps)
    return decay_curve(progress, shape=config.decay_type, floor=floor)


def decay_curve(progress: float, *, shape: str, floor: float) -> float:
    """From 1 at progress 0 down to ``floor`` at progress 1: linear, cosine or 1-sqrt."""
    if shape == "linear":
        return 1.0 - (1.0 - floor) * progress
    if shape == "1-sqrt":  # WSD's tail in Hagele et al. 2024: falls fast first, then flattens
        return floor + (1.0 - floor) * (1.0 - math.sqrt(progress))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class LRSchedulersContainer:
    """One LambdaLR per inner optimizer, stepped together; state is the shared step count."""

    def __init__(self, optimizers: torch.optim.Optimizer, config: LRSchedulerSection, *, total_steps: int) -> None:
        warmup = min(config.warmup_steps, total_steps)

        def factor(step: int) -> float:
            return lr_multiplier(step, warmup=warmup, total=total_steps, config=config)

        self._factor = factor
        # A spec's own build_optimizers_fn may return a plain optimizer: it is its only part.
        inner = optimizers.optimizers if isinstance(optimizers, OptimizersContainer) else [optimizers]
        self.schedulers = [LambdaLR(opt, factor) for opt in inner]

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def get_last_lr(self) -> float:
        """The scheduled LR (a group's lr_mult taken out: the first group may be scaled)."""
        groups = self.schedulers[0].optimizer.param_groups
        for lr, group in zip(self.schedulers[0].get_last_lr(), groups):
            mult = float(group.get("lr_mult", 1.0))
            if mult > 0:
                return float(lr) / mult
        return 0.0

    def state_dict(self) -> dict[str, Any]:
        # Every scheduler has the same step count; saving one keeps the state layout-free.
        return {"last_epoch": int(self.schedulers[0].last_epoch)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        last = int(state_dict["last_epoch"])
        for scheduler in self.schedulers:
            scheduler.last_epoch = last
            lrs = [base * self._factor(last) for base in scheduler.base_lrs]
            for group, lr in zip(scheduler.optimizer.param_groups, lrs):
                group["lr"] = lr
            scheduler._last_lr = lrs  # what get_last_lr() reports


def _mixes_dtensor_and_plain(model_parts: list[nn.Module]) -> bool:
    from torch.distributed.tensor import DTensor

    kinds = {isinstance(p, DTensor) for part in model_parts for p in part.parameters() if p.requires_grad}
    return len(kinds) > 1
