"""The loss-spike guard (``[stability] spike_guard``): a step whose loss stands far above the recent ones
does not update the weights.

The guard keeps the losses of the last ``spike_window`` accepted steps (the global loss every rank
reads, so every rank decides alike). Once it holds ``spike_min_steps`` of them, a step whose loss
exceeds their mean + ``spike_sigmas`` standard deviations is a spike: the Trainer skips its update
the way ``training.skip_nonfinite_steps`` skips a non-finite step (gradients dropped, no optimizer,
LR scheduler or EMA step), says so in one console line, and marks its metrics record
``spike_skipped``. A spike is not added to the window, so a run of bad batches cannot raise the bar.

With ``spike_rollback = N``, N spikes in a row roll the run back to its newest checkpoint (weights,
optimizer, LR schedule, EMA, this window, the step) while the data goes on after the spikes: the
batches since that checkpoint are never trained on. One line says so; the record of the step that
triggered it carries ``spike_rollback``.

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

    def __init__(self, *, window: int, sigmas: float, min_steps: int, rollback: int = 0) -> None:
        self.window, self.sigmas, self.min_steps, self.rollback = window, sigmas, min_steps, rollback
        self.losses: list[float] = []  # oldest first
        self.spikes = 0  # skipped in this process
        self.in_a_row = 0  # spikes since the last accepted step (or rollback)

    @classmethod
    def from_config(cls, section: StabilitySection) -> SpikeGuard | None:
        if not section.spike_guard:
            return None
        return cls(window=section.spike_window, sigmas=section.spike_sigmas, min_steps=section.spike_min_steps,
                   rollback=section.spike_rollback)

    def rollback_due(self) -> bool:
        """Whether the spikes in a row reached ``spike_rollback`` (never with 0)."""
        return bool(self.rollback) and self.in_a_row >= self.rollback

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
            self.in_a_row += 1
            if is_rank0:
                say(f"[titan] step {step}: loss {loss:.4f} is a spike (above {bar[0]:.4f} = mean {bar[1]:.4f} + "
                    f"{self.sigmas:g} x std {bar[2]:.4f} of the last {len(self.losses)} accepted steps): its update "
                    f"is skipped ([stability] spike_guard)")
            return True
        self.in_a_row = 0
        self.losses.append(loss)
        del self.losses[:-self.window]
        return False

    def rolled_back(self, *, step: int, to_step: int | None, is_rank0: bool) -> None:
        """After ``spike_rollback`` spikes in a row: one line says where the run went (``to_step`` None: nowhere,
        no checkpoint yet); the count starts again."""
        self.in_a_row = 0
        if not is_rank0:
            return
        if to_step is None:
            say(f"[titan] step {step}: {self.rollback} spikes in a row, but the run has no checkpoint yet to roll back "
                f"to: training goes on ([stability] spike_rollback)")
        else:
            say(f"[titan] step {step}: {self.rollback} spikes in a row: rolled back to the checkpoint of step {to_step}; "
                f"the data of steps {to_step + 1} to {step} is skipped ([stability] spike_rollback)")

    # The checkpoint's ``spike_guard`` entry: the window as plain floats (JSON, exact).
    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        losses = state_dict.get("losses")
        if not isinstance(losses, list) or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
            raise CheckpointError(f"the checkpoint's {SPIKE_GUARD} entry is not a list of finite losses: it is damaged; "
                                  "resume from another checkpoint or start fresh with --checkpoint.resume=never.")
        self.losses = [float(x) for x in losses][-self.window:]
