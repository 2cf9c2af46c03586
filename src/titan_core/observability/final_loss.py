"""The loss a run ends on, smoothed: one step's loss is noise (one batch), so the figure a run reports at its
end, and the report's summary, is the mean of the last few steps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Steps averaged: enough to damp one batch's noise on the debug models (their step-to-step spread is about
# 0.1 at step 300), few enough that the mean still tracks the end of a falling curve.
FINAL_LOSS_WINDOW = 10


@dataclass(frozen=True)
class FinalLoss:
    mean: float  # over the last ``count`` finite values
    count: int
    last: float  # the very last value (possibly non-finite)

    def describe(self, unit: str = "steps") -> str:
        """``4.1234 (mean of the last 10 steps), last step 4.0567``."""
        if self.count <= 1:
            return f"{self.last:.4f} (one step)" if self.count == 1 else f"{self.last:.4f}"
        return f"{self.mean:.4f} (mean of the last {self.count} {unit}), last step {self.last:.4f}"


def final_loss(losses: Sequence[float], window: int = FINAL_LOSS_WINDOW) -> FinalLoss | None:
    """The mean of the last ``window`` finite losses, with the last loss itself; None for no loss at all.

    A non-finite loss in the window is left out of the mean (it is shown as the last step when it is the last)."""
    if not losses:
        return None
    tail = [x for x in losses[-window:] if math.isfinite(x)]
    mean = math.fsum(tail) / len(tail) if tail else math.nan
    return FinalLoss(mean=mean, count=len(tail), last=float(losses[-1]))


__all__ = ["FINAL_LOSS_WINDOW", "FinalLoss", "final_loss"]
