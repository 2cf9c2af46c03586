"""A deadline on reading a network source: the reader must make progress every ``seconds``.

The reading runs in a daemon thread (a socket read blocked on a silent server cannot be
interrupted from Python); the calling thread waits and, when no row arrived for
``seconds``, raises one ConfigError naming the source, what it was waiting for, the
endpoint and proxy it went through, and the setting. The stuck thread is abandoned: it is a
daemon, so it does not keep the process alive.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _route() -> str:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    proxy = next((f"{n}={os.environ[n]}" for n in _PROXY_VARS if os.environ.get(n)), None)
    return f"{endpoint}" + (f" through the proxy {proxy}" if proxy else "")


def _silence(source: str, seconds: float, rows: int, setting: str, flag: str) -> ConfigError:
    stage = ("before the first row arrived (connecting, or waiting for the server's first answer)"
             if rows == 0 else f"after {rows:,} rows")
    return ConfigError(
        f'data.source "{source}": no data for {seconds:g} s ({setting}) {stage}, from {_route()}. '
        f"The server or proxy accepted the connection but does not answer, or the network is down. Check "
        f"HF_ENDPOINT and the proxy settings, use a local copy of the data, or raise {flag} for a slow link."
    )


def bounded_rows(rows: Iterator[T], *, seconds: float, source: str, flag: str) -> Iterator[T]:
    """``rows``, each of which must arrive within ``seconds`` of the one before (or of the start); one
    ConfigError naming ``source``, the endpoint and the ``flag`` that sets ``seconds`` otherwise. The rows are read ahead (a few)
    in a daemon thread, which a silent server can hold for ever without holding the process."""
    box: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=64)
    stop = threading.Event()

    def read() -> None:
        try:
            for row in rows:
                while not stop.is_set():
                    try:
                        box.put(("row", row), timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put(("end", None))
        except BaseException as exc:  # re-raised in the reading thread
            box.put(("error", exc))

    threading.Thread(target=read, name=f"read {source}", daemon=True).start()
    count = 0
    try:
        while True:
            try:
                kind, value = box.get(timeout=seconds)
            except queue.Empty:
                raise _silence(source, seconds, count, flag, flag) from None
            if kind == "end":
                return
            if kind == "error":
                raise value  # type: ignore[misc]
            count += 1
            yield value  # type: ignore[misc]
    finally:
        stop.set()


def stall_deadline(read: Callable[[Callable[[int], None]], T], *, seconds: float, source: str) -> T:
    """``read(tick)`` in a thread; ``tick(rows)`` marks progress. ConfigError after ``seconds`` without any."""
    state: dict[str, object] = {}
    last = [time.monotonic(), 0]
    done = threading.Event()

    def tick(rows: int) -> None:
        last[0], last[1] = time.monotonic(), rows

    def run() -> None:
        try:
            state["result"] = read(tick)
        except BaseException as exc:  # re-raised in the calling thread
            state["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"read {source}", daemon=True).start()
    while not done.wait(0.2):
        if time.monotonic() - float(last[0]) > seconds:
            raise _silence(source, seconds, int(last[1]), "data.hf_timeout_s", "--data.hf_timeout_s")
    if "error" in state:
        raise state["error"]  # type: ignore[misc]
    return state["result"]  # type: ignore[return-value]
