"""Noticing a non-finite loss or gradient norm without copying either to the host every step.

Reading a loss on the host (``float(loss)``) waits for the accelerator to finish the
step, which stalls the next step's kernel launches. The Trainer reads the loss and the
gradient norm only on the steps that need them anyway (logging, checkpoint, validation,
the last step, or every step with ``training.skip_nonfinite_steps``). On the other steps
this watch keeps, on the device, the number of the first step whose values were not
finite; the next reading step reads that one integer and stops the run naming it, before
anything of it is saved.
"""

from __future__ import annotations

import torch


class FiniteWatch:
    """The first step (0: none) whose loss or gradient norm was NaN or infinite, kept on the device."""

    def __init__(self, device: torch.device) -> None:
        self.first_bad = torch.zeros((), dtype=torch.int64, device=device)

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Note ``step``'s values; device operations only (no host copy, no wait)."""
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self.first_bad = torch.where(bad & (self.first_bad == 0), step, self.first_bad)

    def first_bad_step(self) -> int:
        """The first non-finite step noted since the start (0: none); copies one integer to the host."""
        return int(self.first_bad)
