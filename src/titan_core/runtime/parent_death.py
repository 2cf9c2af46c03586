"""A child process that ends when the process that started it dies, however it dies.

A parent killed with SIGKILL runs no clean-up: children it started in a session of their
own (the fault-tolerance supervisor's replica groups, spare and lighthouse) or that wait on
a pipe it held (``titan-data prepare``'s workers) would run or wait for ever. On Linux the
kernel sends a child a chosen signal when its parent thread ends (``PR_SET_PDEATHSIG``);
``end_with_parent`` asks for it from inside the child, and ``ended_with_parent`` is the
``preexec_fn`` that does so for a program started with ``subprocess`` (it survives ``exec``).

The signal follows the *thread* that forked the child: start such children from the main
thread (or one that lives as long as the process). Elsewhere than Linux both are no-ops.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["end_with_parent", "ended_with_parent"]

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def end_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """This process gets ``sig`` when its parent dies; it ends now if the parent ``parent_pid`` is already gone."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request was made: nobody will signal us
        os.kill(os.getpid(), sig)


def ended_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the program started ends when this process dies."""
    parent = os.getpid()
    prctl = _prctl()  # loaded here, in the parent: the child between fork and exec only calls it

    def preexec() -> None:
        if prctl is None:
            return
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec
