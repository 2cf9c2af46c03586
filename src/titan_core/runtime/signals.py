"""SIGTERM and SIGINT in a training process: stop cleanly, never leave half a checkpoint.

- SIGTERM (what schedulers send before preemption) only records the request; the
  training loop checks it at each step boundary, agrees on it with the other ranks
  (one ``all_reduce``, so every rank stops after the same step), saves a checkpoint
  when ``checkpoint.save_on_sigterm`` is on, and exits 143 (128 + SIGTERM).
  While the run is being set up (no step boundary near, nothing trained to save) SIGTERM stops it at
  once instead, with the same exit code.
- SIGINT (Ctrl+C) stops at once with exit 130, except inside a checkpoint save: there
  it is held back until the save is published, so an interrupted run never leaves a
  half-written checkpoint behind. A second SIGINT is ignored while the first unwinds.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

from ..errors import Terminated

if TYPE_CHECKING:
    pass

__all__ = ["handlers_installed", "no_interrupt", "requested_signal", "sigterm_raises", "sigterm_stops_at_once"]

_state = {"installed": False, "term": 0, "int_pending": False, "int_deferred": 0, "term_raises": False}


def _on_term(signum: int, frame: FrameType | None) -> None:
    _state["term"] = signum
    if _state["term_raises"] and not _state["int_deferred"]:
        raise Terminated


def _on_int(signum: int, frame: FrameType | None) -> None:
    if _state["int_pending"]:
        return  # already unwinding from the first Ctrl+C
    if _state["int_deferred"]:
        _state["int_pending"] = True  # raised when the checkpoint save ends
        return
    _state["int_pending"] = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def handlers_installed() -> Iterator[None]:
    """The handlers for the duration (main thread only; elsewhere, e.g. a notebook's worker thread,
    nothing is installed); the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_int)
    _state.update(installed=True, term=0, int_pending=False, int_deferred=0, term_raises=False)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.update(installed=False, term=0, term_raises=False)


def interrupted_by_signal() -> bool:
    """True when a KeyboardInterrupt now unwinding came from a real SIGINT (not raised by some code itself)."""
    return bool(_state["int_pending"]) or not _state["installed"]


def requested_signal() -> int:
    """The signal number of a pending stop request (SIGTERM), or 0."""
    return int(_state["term"])


@contextlib.contextmanager
def no_interrupt() -> Iterator[None]:
    """Hold SIGINT back for the duration (a checkpoint save); re-raise it afterwards."""
    _state["int_deferred"] += 1
    try:
        yield
    finally:
        _state["int_deferred"] -= 1
    if _state["installed"] and _state["int_pending"] and not _state["int_deferred"]:
        raise KeyboardInterrupt
    if _state["installed"] and _state["term_raises"] and _state["term"] and not _state["int_deferred"]:
        raise Terminated  # held back by the save, like Ctrl+C


@contextlib.contextmanager
def sigterm_stops_at_once() -> Iterator[None]:
    """Inside ``handlers_installed``: SIGTERM raises :class:`Terminated` for the duration (inside a checkpoint
    save, when the save is published). For phases with no step boundary near, such as setting a run up: a
    long initialisation or a read that blocks would hold a recorded request past a scheduler's grace period
    (then SIGKILL), where a run that has not trained yet has nothing to save and can stop at once."""
    previous = _state["term_raises"]
    _state["term_raises"] = True
    try:
        if _state["installed"] and _state["term"] and not _state["int_deferred"]:
            raise Terminated  # requested just before this phase began
        yield
    finally:
        _state["term_raises"] = previous


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` for the duration (main thread only), so ``finally`` blocks and
    temporary folders are cleaned up before the tool exits 143."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
