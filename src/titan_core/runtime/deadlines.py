"""Deadlines for calls into code the core does not control: a plugin's method that never returns.

``call_deadline(seconds, what)`` arms ``SIGALRM`` (main thread only); when it fires, the
handler raises :class:`DeadlinePassed` inside the stuck call, and the caller turns it into one
message naming the call and the setting that bounds it. Two ways the alarm cannot help are
covered by a watchdog thread that exits the process (code 2) with the same message
``GRACE_S`` seconds after the deadline: a call blocked inside C code that never returns to
Python (the handler never runs), and a plugin that catches the exception and carries on.

Nested deadlines keep the outer one (an alarm already armed is left alone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from ..console import say
from ..errors import DeadlinePassed
from .worker_errors import hand_to_launcher

__all__ = ["GRACE_S", "call_deadline"]

GRACE_S = 10.0


def _hard_exit(message: str) -> None:
    """The watchdog's last resort: one message (once per --nproc-per-node run), exit 2, no cleanup to wait on."""

    with contextlib.suppress(Exception):
        if not hand_to_launcher(message, hint=False):
            prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "titan"
            prog = "titan-train" if prog in ("__main__.py", "-m", "-c") else prog
            say(f"{prog}: error: {message}")
    os._exit(2)


class _Watchdog:
    """One daemon thread for the process; ``arm`` and ``disarm`` only set a variable (calls are frequent:
    a model's forward runs under a deadline every micro-step)."""

    def __init__(self) -> None:
        self.armed: tuple[float, Callable[[], str]] | None = None
        self.thread: threading.Thread | None = None

    def arm(self, until: float, message: Callable[[], str]) -> None:
        self.armed = (until, message)
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, name="titan-deadline-watchdog", daemon=True)
            self.thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            armed = self.armed
            if armed is not None and time.monotonic() > armed[0]:
                _hard_exit(armed[1]())


_watchdog = _Watchdog()


@contextlib.contextmanager
def call_deadline(seconds: float | None, what: str, *, message: Callable[[], str]) -> Iterator[None]:
    """Bound the block to ``seconds``: DeadlinePassed inside it, or exit 2 with ``message()`` GRACE_S later."""
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "SIGALRM")
              and threading.current_thread() is threading.main_thread())
    if not usable or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return
    assert seconds is not None

    def fire(signum: int, frame: FrameType | None) -> None:
        raise DeadlinePassed(what, seconds)

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    _watchdog.arm(time.monotonic() + seconds + GRACE_S, message)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _watchdog.armed = None
