"""Background prefetch of the next batches, keeping the loader's state exact.

A thread calls ``next(loader)`` ahead of the training step and queues each batch
with the loader's state right after it. ``state_dict()`` is the state after the
last batch the step *consumed*, not after the ones prefetched, so a checkpoint
resumes exactly where training was. ``wait_ms()`` is the time the step spent
waiting for data since it was last read (``data_ms`` in the metrics).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

import torch

_DEPTH = 2  # batches queued ahead; one more is being made


class StatefulIterator(Protocol):
    """What the prefetcher drives: the next batch, and the state that restarts after it."""

    def __next__(self) -> object: ...
    def state_dict(self) -> Mapping[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], /) -> None: ...
    def reset(self) -> None: ...


class PrefetchingLoader:
    """Wraps a stateful loader (``__next__``, ``state_dict``, ``load_state_dict``); other attributes pass through."""

    def __init__(self, loader: StatefulIterator) -> None:
        self.loader = loader
        self._state: dict[str, Any] = dict(loader.state_dict())
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=_DEPTH)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._waited = 0.0

    def __getattr__(self, name: str) -> Any:  # e.g. tokens_per_batch, num_windows
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> PrefetchingLoader:
        return self

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                item: Any = (next(self.loader), dict(self.loader.state_dict()))
            except BaseException as exc:  # handed to the step, which raises it where a direct next() would
                item = exc
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._work, name="titan-data-prefetch", daemon=True)
            self._thread.start()
        start = time.perf_counter()
        item = self._queue.get()
        self._waited += time.perf_counter() - start
        if isinstance(item, BaseException):
            self._halt()
            raise item
        batch, self._state = item
        return batch  # type: ignore[no-any-return]

    def wait_ms(self) -> float:
        """Milliseconds spent waiting for batches since the last call."""
        waited, self._waited = self._waited, 0.0
        return waited * 1000.0

    def _halt(self) -> None:
        """Stop the thread, drop what it made ahead, and put the loader back to the consumed state."""
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        self._thread = None
        self._queue = queue.Queue(maxsize=_DEPTH)
        self.loader.load_state_dict(self._state)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._halt()
        self.loader.load_state_dict(state)
        self._state = dict(self.loader.state_dict())

    def reset(self) -> None:
        self._halt()
        self.loader.reset()
        self._state = dict(self.loader.state_dict())

    def close(self) -> None:
        self._halt()

    def __repr__(self) -> str:
        return f"PrefetchingLoader({self.loader!r})"
