"""A run stopped by SIGTERM or Ctrl+C at a step boundary: save when configured, say where, exit 128 + signal.

The signal itself is noticed by the process-level handlers (``runtime/signals.py``); this is what the
Trainer does once its step is over.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, NoReturn

from .checkpoint.layout import step_dirname
from .errors import StopRequested
from .runtime.signals import no_interrupt

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["stop_after_signal"]


def stop_after_signal(trainer: Trainer, signum: int) -> NoReturn:
    """Save (when configured), close the metrics, and raise StopRequested with one line saying where it saved."""

    name = signal.Signals(signum).name
    c = trainer.config.checkpoint
    if c.enable and c.save_on_sigterm:
        with no_interrupt():
            trainer.checkpointer.maybe_save(trainer.step, tokens_seen=trainer.tokens_seen, last=True)
            trainer.checkpointer.wait()
        where = f"checkpoint saved to {trainer.checkpointer.folder / step_dirname(trainer.step)}"
    elif c.enable:
        where = "no checkpoint saved (checkpoint.save_on_sigterm=false)"
    else:
        where = "no checkpoint saved (checkpointing is off: --checkpoint.enable=true saves one on SIGTERM)"
    trainer.metrics.close()
    raise StopRequested(f"titan-train: stopped by {name} after step {trainer.step}; {where}",
                        signum=signum, quiet=not trainer.is_rank0)
