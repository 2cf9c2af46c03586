"""What a checkpoint holds, as named ``Stateful`` objects: ``CheckpointManager`` saves each one's
``state_dict()`` under its name and gives it back through ``load_state_dict``.

The names are the checkpoint's top-level keys, so they are part of the on-disk format:
``model`` (a :class:`ModelState`, required), ``optimizer`` (an :class:`OptimizerState`; never
loaded when the converters changed), ``lr_scheduler``, ``dataloader`` and ``progress`` (step
and tokens seen: the Trainer, or a :class:`StepCounter`). ``rng`` is the manager's own (one
entry per rank). ``ema`` (train/ema.py: the EMA of each parameter, ``ema.<fqn>``) is present only
in checkpoints of runs with ``[ema]``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from . import states

MODEL, OPTIMIZER, PROGRESS, RNG = "model", "optimizer", "progress", "rng"
EMA = "ema"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class ModelState:
    """The model parts as one state dict (canonical fqns, DTensor shards as they are)."""

    def __init__(self, model_parts: list[nn.Module]) -> None:
        self.view = states.merged_view(model_parts)

    def state_dict(self) -> dict[str, Any]:
        return states.model_state(self.view)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states.load_model_state(self.view, state_dict)


class OptimizerState:
    """The optimizer's state keyed by the fqns of ``model``'s parameters (reshards across layouts)."""

    def __init__(self, model: ModelState, optimizer: torch.optim.Optimizer) -> None:
        self.view, self.optimizer = model.view, optimizer

    def state_dict(self) -> dict[str, Any]:
        return states.optimizer_state(self.view, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states.load_optimizer_state(self.view, self.optimizer, state_dict)


def progress_state(step: int, tokens_seen: int) -> dict[str, Any]:
    """The ``progress`` entry: tensors, so DCP stores them without pickling."""
    return {"step": torch.tensor(step, dtype=torch.int64), "tokens_seen": torch.tensor(tokens_seen, dtype=torch.int64)}


class StepCounter:
    """``progress`` for a holder without one of its own (a weights-only checkpoint, the old
    constructor): the manager sets it to the step it saves."""

    def __init__(self, step: int = 0, tokens_seen: int = 0) -> None:
        self.step, self.tokens_seen = step, tokens_seen

    def state_dict(self) -> dict[str, Any]:
        return progress_state(self.step, self.tokens_seen)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step, self.tokens_seen = int(state_dict["step"]), int(state_dict["tokens_seen"])


def training_states(model_parts: list[nn.Module], optimizer: torch.optim.Optimizer, *, lr_schedulers: Stateful,
                    dataloader: Stateful, progress: Stateful | None = None) -> dict[str, Stateful]:
    """The states of a training run, under the names its checkpoints have always used."""
    model = ModelState(model_parts)
    named: dict[str, Stateful] = {MODEL: model, OPTIMIZER: OptimizerState(model, optimizer),
                                  "lr_scheduler": lr_schedulers, "dataloader": dataloader}
    if progress is not None:
        named[PROGRESS] = progress
    return named
