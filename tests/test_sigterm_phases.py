"""SIGTERM inside one process, phase by phase (runtime/signals.py): recorded for the step boundary while
training, raised at once while a run is set up, and held back by a checkpoint save in either phase."""

from __future__ import annotations

import os
import signal
import time

import pytest

from titan_core.errors import Terminated
from titan_core.runtime import signals


def _term() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # the handler runs in the main thread at the next bytecode


def test_sigterm_is_recorded_while_training_and_raised_while_setting_up() -> None:
    with signals.handlers_installed():
        _term()
        assert signals.requested_signal() == signal.SIGTERM  # training: only recorded, the run goes on
    previous = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    with signals.handlers_installed():
        started = time.monotonic()
        with pytest.raises(Terminated), signals.sigterm_stops_at_once():
            signal.setitimer(signal.ITIMER_REAL, 0.2)  # SIGALRM below sends SIGTERM while the sleep blocks
            time.sleep(30)  # a blocking wait, as a hung read: the signal ends it
            pytest.fail("SIGTERM did not stop the set-up")
        signal.signal(signal.SIGALRM, previous)
        assert time.monotonic() - started < 5
        _term()
        assert signals.requested_signal() == signal.SIGTERM  # after the phase: recorded again, nothing raised


def test_a_sigterm_during_a_save_in_the_set_up_waits_for_the_save() -> None:
    saved = []
    with signals.handlers_installed():
        with pytest.raises(Terminated), signals.sigterm_stops_at_once():
            with signals.no_interrupt():
                _term()
                saved.append("published")  # the save finished despite the signal
            pytest.fail("the held-back SIGTERM was not raised after the save")
    assert saved == ["published"]


def test_a_sigterm_just_before_the_set_up_stops_it_as_it_begins() -> None:
    with signals.handlers_installed():
        _term()
        with pytest.raises(Terminated), signals.sigterm_stops_at_once():
            pytest.fail("the set-up began despite the pending SIGTERM")


class _SetUpThatBlocks:
    """A trainer whose set-up waits as a hung read would; SIGTERM comes 0.2 s in."""

    step = 0

    def __init__(self, resolved: object = None) -> None:
        self.trained = False

    def setup(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        time.sleep(30)

    def train(self) -> list[float]:
        self.trained = True
        return []


@pytest.mark.parametrize("way", ["titan-train", "--compare-baseline"])
def test_sigterm_while_a_trainer_sets_up_is_one_line_and_143(way: str) -> None:
    from titan_core.commands.compare import train_once
    from titan_core.commands.train import trained
    from titan_core.errors import StopRequested

    previous = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    started = time.monotonic()
    try:
        with signals.handlers_installed(), pytest.raises(StopRequested) as stop:
            if way == "titan-train":
                trained(_SetUpThatBlocks())  # type: ignore[arg-type]
            else:
                train_once(None, "baseline", _SetUpThatBlocks)  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 5
    assert stop.value.exit_code == 143
    assert str(stop.value) == ("titan-train: stopped by SIGTERM while setting the run up, before its first step; "
                               "nothing new to save")
