"""A process waiting for its peers says so within seconds: for whom, where, and until when.

Rendezvous can block in three places (rank 0's store waiting for clients to connect, a
client connecting to a store that is not up yet, the head count after connecting), each
for up to ``parallelism.init_timeout_s``, which defaults to 5 minutes. A timer prints one
line after ``after_s`` seconds if the process is still waiting, and one more every
``every_s`` seconds, so nobody stares at a silent terminal wondering which process hangs.
"""

from __future__ import annotations

import datetime
import sys
import threading
from typing import Any

__all__ = ["WaitingNotice"]


class WaitingNotice:
    """Use as a context manager around the blocking part; update ``joined`` when it is known."""

    def __init__(self, *, rank: int, world_size: int, where: str, timeout_s: float, role: str,
                 after_s: float = 3.0, every_s: float = 30.0) -> None:
        self.rank, self.world_size, self.where, self.role = rank, world_size, where, role
        self.joined: int | None = None  # processes known to have joined (the store's head count)
        self.after_s, self.every_s = after_s, every_s
        now = datetime.datetime.now(datetime.timezone.utc)
        self.deadline = (now + datetime.timedelta(seconds=timeout_s)).strftime("%H:%M:%S UTC")
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="titan-waiting-notice", daemon=True)

    def __enter__(self) -> WaitingNotice:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def message(self) -> str:
        if self.joined is not None:
            missing = self.world_size - self.joined
            whom = (f"{missing} more of WORLD_SIZE={self.world_size} processes ({self.joined} joined so far)")
        else:
            whom = self.role
        return (f"[titan] rank {self.rank} is waiting for {whom} at {self.where}, until {self.deadline} "
                f"(parallelism.init_timeout_s={self.timeout_s:g}); start the missing processes or stop this one")

    def _run(self) -> None:
        wait = self.after_s
        while not self._stop.wait(wait):
            print(self.message(), file=sys.stderr, flush=True)
            wait = self.every_s
