"""A run stopped by SIGTERM or Ctrl+C at a step boundary: save when configured, say where, exit 128 + signal.

The signal itself is noticed by the process-level handlers (``runtime/signals.py``); this is what the
Trainer does once its step is over.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, NoReturn

from ..checkpoint.layout import step_dirname
from ..errors import StopRequested
from ..runtime.signals import no_interrupt

if TYPE_CHECKING:
    from ..checkpoint.manager import CheckpointManager
    from ..config.sections import CheckpointSection
    from ..plugin.spec_factories import MetricsProcessor

__all__ = ["stop_after_signal"]


def stop_after_signal(signum: int, *, step: int, tokens_seen: int, checkpoint: CheckpointSection,
                      checkpointer: CheckpointManager, metrics: MetricsProcessor, is_rank0: bool) -> NoReturn:
    """Save (when configured), close the metrics, and raise StopRequested with one line saying where it saved.

    Takes the Trainer's parts, not the Trainer, so this module sits below ``trainer`` with no way back up."""

    name = signal.Signals(signum).name
    c = checkpoint
    if c.enable and c.save_on_sigterm:
        with no_interrupt():
            checkpointer.maybe_save(step, tokens_seen=tokens_seen, last=True)
            checkpointer.wait()
        where = f"checkpoint saved to {checkpointer.folder / step_dirname(step)}"
    elif c.enable:
        where = "no checkpoint saved (checkpoint.save_on_sigterm=false)"
    else:
        where = "no checkpoint saved (checkpointing is off: --checkpoint.enable=true saves one on SIGTERM)"
    metrics.close()
    raise StopRequested(f"titan-train: stopped by {name} after step {step}; {where}", signum=signum, quiet=not is_rank0)
