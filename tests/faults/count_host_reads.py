"""Test-only spy: records the step at which the training loss or gradient norm is read on the host.

Loaded with ``--import count_host_reads`` (``tests/faults`` on PYTHONPATH). The Trainer's
global loss and gradient norm are wrapped in a tensor subclass whose ``float()``/``item()``
note the step being trained (or, outside ``train_step``, the last finished step). At exit
the notes are written as JSON to ``TITAN_TEST_HOST_READS``. Production code holds no hook:
the module wraps two names from outside.
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any

import torch

import titan_core.train.trainer as trainer_module
from titan_core import Trainer

READS: list[int] = []
_current: dict[str, Any] = {"trainer": None, "in_step": False}


def _note() -> None:
    trainer = _current["trainer"]
    if trainer is not None:
        READS.append(trainer.step + 1 if _current["in_step"] else trainer.step)


class CountedRead(torch.Tensor):
    def __float__(self) -> float:
        _note()
        return float(self.as_subclass(torch.Tensor))

    def item(self) -> Any:  # type: ignore[override]
        _note()
        return self.as_subclass(torch.Tensor).item()


def _counted(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(CountedRead)


_train_step = Trainer.train_step
_global_loss_on_device = Trainer.global_loss_on_device
_clip = trainer_module.clip_grad_norm_on_device


def train_step(self: Any, batches: Any) -> Any:
    _current["trainer"], _current["in_step"] = self, True
    try:
        return _train_step(self, batches)
    finally:
        _current["in_step"] = False


def global_loss_on_device(self: Any, loss: Any) -> Any:
    return _counted(_global_loss_on_device(self, loss))


def clip_grad_norm_on_device(*args: Any, **kwargs: Any) -> Any:
    return _counted(_clip(*args, **kwargs))


@atexit.register
def _write() -> None:
    with open(os.environ["TITAN_TEST_HOST_READS"], "w") as f:
        json.dump(READS, f)


Trainer.train_step = train_step  # type: ignore[method-assign]
Trainer.global_loss_on_device = global_loss_on_device  # type: ignore[method-assign]
trainer_module.clip_grad_norm_on_device = clip_grad_norm_on_device  # type: ignore[assignment]
