"""The ``[stability]`` section: z-loss on the output logits and the loss-spike guard (docs/optimizer.md)."""

from __future__ import annotations

from pydantic import Field, model_validator

from .sections import Section


class StabilitySection(Section):
    """Off by default: z_loss = 0 adds nothing, spike_guard = false reads nothing more on the host, qk_clip_threshold = 0
    runs no extra forward."""

    z_loss: float = Field(0.0, ge=0, description="Coefficient of the z-loss: adds z_loss * mean over the valid tokens of logsumexp(logits)^2 to the trained loss, which keeps the output logits from drifting (PaLM used 1e-4); the logged loss stays plain cross-entropy, the term is logged as z_loss. 0 = off.")
    spike_guard: bool = Field(False, description="Skip the update of a step whose loss exceeds the mean + spike_sigmas standard deviations of the last spike_window accepted steps' losses (one console line, spike_skipped in its metrics record). Reads every step's loss on the host (a wait for the accelerator each step).")
    spike_window: int = Field(100, ge=2, description="Accepted steps whose losses the spike guard keeps (the most recent ones).")
    spike_sigmas: float = Field(6.0, gt=0, description="How many standard deviations above the window's mean a loss must be to be a spike.")
    spike_min_steps: int = Field(20, ge=2, description="Accepted steps the window must hold before the spike guard judges a step (the early losses fall fast and would look like spikes).")
    qk_clip_threshold: float = Field(0.0, ge=0, description="QK-clip: after each optimizer step the step's last micro-batch runs forward once more (no gradient) and each attention head whose largest logit q.k*scale exceeds this threshold has its query and key projection rows rescaled so that logit becomes the threshold (MuonClip; about a third of a step's time more). Logged per layer as qk_clip/<id>/max_logit (after the clip), max_logit_before and clipped_heads. Needs a model whose attention records its logits (titan-llama, titan-qwen3, titan-deepseek). 0 = off.")
    spike_rollback: int = Field(0, ge=0, description="After this many spikes in a row, roll back to the run's newest checkpoint (weights, optimizer, LR schedule, EMA, the guard's window) and go on with the data after the spikes: the data since that checkpoint is skipped. Needs spike_guard and checkpoint.enable. 0 = never.")

    @model_validator(mode="after")
    def _guard_settings_agree(self) -> StabilitySection:
        if self.spike_min_steps > self.spike_window:
            raise ValueError(f"stability.spike_min_steps={self.spike_min_steps} exceeds stability.spike_window="
                             f"{self.spike_window}: the guard would never act. Make spike_min_steps at most the window")
        if self.spike_rollback and not self.spike_guard:
            raise ValueError(f"stability.spike_rollback={self.spike_rollback} needs the spike guard: set "
                             "stability.spike_guard=true, or leave spike_rollback at 0")
        return self
