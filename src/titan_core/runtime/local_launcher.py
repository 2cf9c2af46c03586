"""``titan-train --nproc-per-node N``: start N workers on this machine and look after them.

What it adds over a bare process spawn, each the reason this file exists:

- **Signals.** SIGTERM/SIGINT/SIGHUP sent to the launcher are forwarded to every
  worker (they run in sessions of their own, so a terminal's Ctrl+C reaches the
  launcher only and each worker gets the signal exactly once). The workers stop
  together at a step boundary; the launcher exits with their code (143 for SIGTERM,
  130 for SIGINT), never with a traceback of its own.
- **No hangs.** When a worker dies (killed, crashed) or stops answering (SIGSTOP,
  a deadlock that made the others' collectives time out), the launcher stops the
  remaining workers within a few seconds and prints one message naming the rank.
- **The store** the workers meet at is hosted here, so a frozen rank 0 cannot take
  the rendezvous down with it, and the port is chosen by the kernel (no clash
  between two runs on one machine).

Exit codes: the workers' common code; otherwise the failed rank's (128 + signal
when it was killed by a signal); ``PEER_LOST_EXIT`` (4) when a rank stopped answering.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from ..errors import PEER_LOST_EXIT
from .launch_env import LAUNCHER_ENV
from .parent_death import ended_with_parent
from .run_lock import HELD_BY_LAUNCHER_ENV
from .worker_errors import INTERRUPTED, ErrorInbox

__all__ = ["launch"]

POLL_S = 0.05
STOP_GRACE_S = 3.0
OWN_ERROR_GRACE_S = 2.0  # a rank stopped on a user error: how long the others get to stop on it themselves
_STOP_CODES = {128 + signal.SIGTERM, 128 + signal.SIGINT}
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Worker:
    rank: int
    proc: subprocess.Popen[bytes]

    def code(self) -> int | None:
        return self.proc.poll()

    def state(self) -> str:
        """The kernel's one-letter state ('T' = stopped), '' once gone."""
        try:
            return Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return ""


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        # Nothing in the run sends SIGKILL to a healthy rank; the usual sender is the kernel's OOM killer.
        hint = (": sent by another process or by the kernel's out-of-memory killer; `dmesg | grep -i oom` "
                "tells which") if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


def _worker_env(nproc: int, port: int, run_dir: Path | None) -> dict[str, str]:
    env = {**os.environ, "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
           LAUNCHER_ENV: str(os.getpid())}
    if run_dir is not None:
        env[HELD_BY_LAUNCHER_ENV] = str(run_dir.resolve())
    return env


def launch(nproc: int, worker_args: list[str], *, run_dir: Path | None = None) -> int:
    """Run ``python -m titan_core WORKER_ARGS`` as ranks 0..nproc-1; their exit code."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # noqa: F841 (kept alive)
    env = _worker_env(nproc, store.port, run_dir)
    received: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        for w in workers:
            if w.code() is None:
                w.proc.send_signal(signum)

    workers: list[Worker] = []
    inbox = ErrorInbox()  # each distinct user error of the workers is printed once, here
    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        for rank in range(nproc):
            proc = subprocess.Popen([sys.executable, "-m", "titan_core", *worker_args],
                                    env={**env, **inbox.env(), "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                    start_new_session=True, preexec_fn=ended_with_parent())
            workers.append(Worker(rank, proc))
        code = _supervise(workers, received)
        inbox.report(nproc)
        if code == 128 + signal.SIGINT:  # printed here: the rank that saw Ctrl+C first may not be rank 0
            print(INTERRUPTED, file=sys.stderr, flush=True)
        return code
    finally:
        inbox.close()
        for w in workers:  # nothing outlives the launcher, whatever happened above
            if w.code() is None:
                w.proc.kill()
                w.proc.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _supervise(workers: list[Worker], received: list[int]) -> int:
    while True:
        codes = [w.code() for w in workers]
        # 143/130: a coordinated stop on a signal, the others follow at the same step boundary
        failed = [w for w, c in zip(workers, codes) if c is not None and c != 0 and c not in _STOP_CODES]
        # Checked before "all exited": the survivors of a killed rank can exit between two polls,
        # and the message naming the culprit must be printed all the same.
        if failed:
            return _stop_after_failure(workers, failed)
        if all(c is not None for c in codes):
            return _final_code([c for c in codes if c is not None])
        time.sleep(POLL_S)


def _final_code(codes: list[int]) -> int:
    exits = {_exit_code(c) for c in codes}
    if len(exits) == 1:
        return exits.pop()
    for preferred in (c for c in exits if c not in (0, PEER_LOST_EXIT)):
        return preferred
    return max(exits)


def _stop_after_failure(workers: list[Worker], failed: list[Worker]) -> int:
    """One rank failed: find the culprit, stop the others, print one message when the culprit could not."""
    stopped = [w for w in workers if w.code() is None and w.state() == "T"]
    killed = [w for w in failed if (w.code() or 0) < 0]
    own_error = [w for w in workers if w.code() not in (None, 0, PEER_LOST_EXIT)]
    if own_error and not killed and not stopped:  # a user error the others usually hit too: let them report it
        _wait_for([w for w in workers if w.code() is None], OWN_ERROR_GRACE_S)
    running = [w for w in workers if w.code() is None]
    _stop(running)
    if killed:
        culprit = killed[0]
        code = culprit.proc.returncode
        what = f"died ({_describe_exit(code)})"
        exit_code = _exit_code(code)
    elif stopped:
        culprit, exit_code = stopped[0], PEER_LOST_EXIT
        what = ("stopped answering (its process was stopped, e.g. by SIGSTOP), so the other ranks' collectives "
                "timed out after parallelism.collective_timeout_s")
    elif own_error:
        return _final_code([w.proc.returncode for w in own_error])  # it printed its own message
    else:
        suspects = [w for w in running] or failed
        culprit, exit_code = suspects[0], PEER_LOST_EXIT
        what = ("stopped answering: the other ranks' collectives timed out after "
                "parallelism.collective_timeout_s (a deadlock, or a rank much slower than the others)")
    others = len(workers) - 1
    print(f"titan-train: error: rank {culprit.rank} (pid {culprit.proc.pid}) {what}. Stopped the other "
          f"{others} rank{'s' if others != 1 else ''}; checkpoints already published are intact: rerun the same "
          f"command to resume from the last one.", file=sys.stderr, flush=True)
    return exit_code


def _wait_for(running: list[Worker], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(w.code() is None for w in running) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _stop(running: list[Worker]) -> None:
    """SIGKILL a stopped (frozen) rank at once: nothing it holds can be trusted; SIGTERM the others,
    which stop at their next step boundary or when their collective with the lost rank fails,
    and SIGKILL whoever is left after a short grace."""
    for w in running:
        try:
            w.proc.send_signal(signal.SIGKILL if w.state() == "T" else signal.SIGTERM)
        except ProcessLookupError:
            pass
    _wait_for(running, STOP_GRACE_S)
    for w in running:
        if w.code() is None:
            w.proc.kill()
            w.proc.wait()
