"""The loss-spike guard (``[stability] spike_guard``): a step whose loss stands far above the recent ones
does not update the weights.

The guard keeps the losses of the last ``spike_window`` accepted steps (the global loss every rank
reads, so every rank decides alike). Once it holds ``spike_min_steps`` of them, a step whose loss
exceeds their mean + ``spike_sigmas`` standard deviations is a spike: the Trainer skips its update
the way ``training.skip_nonfinite_steps`` skips a non-finite step (gradients dropped, no optimizer,
LR scheduler or EMA step), says so in one console line, and marks its metrics record
``spike_skipped``. A spike is not added to the window, so a run of bad batches cannot raise the bar.

Deciding needs the loss on the host before the update: with the guard on every step reads it (a wait
for the accelerator each step, as with skip_nonfinite_steps). The window is the checkpoint's
``spike_guard`` entry (plain floats) and resumes exactly.
"""

from __future__ import annotations

import math
from typing import Any

from ..config.stability import StabilitySection
from ..console import say
from ..errors import CheckpointError

SPIKE_GUARD = "spike_guard"  # the checkpoint entry


class SpikeGuard:
    """The window of recent accepted losses and the rule that judges a step against it."""

    optional_in_checkpoint = True  # a checkpoint of a run without the guard resumes with an empty window

    def __init__(self, *, window: int, sigmas: float, min_steps: int) -> None:
        self.window, self.sigmas, self.min_steps = window, sigmas, min_steps
        self.losses: list[float] = []  # oldest first
        self.spikes = 0  # skipped in this process (the metrics record counts them)

    @classmethod
    def from_config(cls, section: StabilitySection) -> SpikeGuard | None:
        if not section.spike_guard:
            return None
        return cls(window=section.spike_window, sigmas=section.spike_sigmas, min_steps=section.spike_min_steps)

    def limit(self) -> tuple[float, float, float] | None:
        """(limit, mean, standard deviation) of the window; None while it holds fewer than ``min_steps``."""
        n = len(self.losses)
        if n < self.min_steps:
            return None
        mean = math.fsum(self.losses) / n
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in self.losses) / n)
        return mean + self.sigmas * std, mean, std

    def judge(self, step: int, loss: float, *, is_rank0: bool) -> bool:
        """True when ``loss`` (finite) is a spike: then one line says so and the window is left as it was;
        otherwise the loss joins the window."""
        bar = self.limit()
        if bar is not None and loss > bar[0]:
            self.spikes += 1
            if is_rank0:
                say(f"[titan] step {step}: loss {loss:.4f} is a spike (above {bar[0]:.4f} = mean {bar[1]:.4f} + "
                    f"{self.sigmas:g} x std {bar[2]:.4f} of the last {len(self.losses)} accepted steps): its update "
                    f"is skipped ([stability] spike_guard)")
            return True
        self.losses.append(loss)
        del self.losses[:-self.window]
        return False

    # The checkpoint's ``spike_guard`` entry: the window as plain floats (JSON, exact).
    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        losses = state_dict.get("losses")
        if not isinstance(losses, list) or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
            raise CheckpointError(f"the checkpoint's {SPIKE_GUARD} entry is not a list of finite losses: it is damaged; "
                                  "resume from another checkpoint or start fresh with --checkpoint.resume=never.")
        self.losses = [float(x) for x in losses][-self.window:]
