"""Test-only fault: the global loss of one training step reads as NaN.

Loaded into a real run with ``--import fault_nonfinite`` (with ``tests/faults`` on
PYTHONPATH); every rank imports it, so every rank sees the same NaN, as a real
non-finite loss would be after the all-reduce. ``TITAN_TEST_NONFINITE_AT_STEP=k``
picks the step. Production code holds no hook for this: the module wraps two
Trainer methods from outside.
"""

from __future__ import annotations

import os
from typing import Any

from titan_core import Trainer

AT_STEP = int(os.environ.get("TITAN_TEST_NONFINITE_AT_STEP", "0"))
_train_step = Trainer.train_step
_global_loss_on_device = Trainer.global_loss_on_device


def train_step(self: Any, batches: Any) -> Any:
    self._fault_nan_now = self.step + 1 == AT_STEP
    try:
        return _train_step(self, batches)
    finally:
        self._fault_nan_now = False


def global_loss_on_device(self: Any, loss: Any) -> Any:
    value = _global_loss_on_device(self, loss)  # still all-reduced: the ranks stay in step
    return value * float("nan") if getattr(self, "_fault_nan_now", False) else value


Trainer.train_step = train_step  # type: ignore[method-assign]
Trainer.global_loss_on_device = global_loss_on_device  # type: ignore[method-assign]
