"""Joining the process group with two deadlines: one to meet, one per collective.

``init_timeout_s`` bounds the rendezvous (a peer that never starts: ``WORLD_SIZE=2``
with one process); ``collective_timeout_s`` bounds every later collective (a rank
that froze or deadlocked). torch's single ``timeout`` would force one figure on both,
so the store is built here with the first and the group with the second.

Nobody leaves the rendezvous before everyone has finished it: a rank whose own side of
gloo's connection mesh is done could otherwise run ahead, stop on an error every rank
will hit (a missing data file), and close its sockets while a peer is still setting up,
which would then report a broken rendezvous instead of the error itself. And a peer
that did go away mid-set-up is reported as that (exit 4, silent under the launcher,
which prints the peer's own error), not as a timeout that never happened.
"""

from __future__ import annotations

import datetime
import os
import re
import time

import torch.distributed as dist

from ..errors import PeerLost, RendezvousError
from .launch_env import LAUNCHER_ENV, env_int, rank_env
from .waiting_notice import WaitingNotice

__all__ = ["join_process_group"]


def _uses_launcher_store() -> bool:
    # torchrun and titan-train --nproc-per-node host the store in the launcher itself.
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "") == "True"


# What a backend says when the process at the other end of a connection went away (gloo, nccl's socket layer).
_PEER_CLOSED = re.compile(r"closed by peer|connection closed|connection reset|broken pipe|ECONNRESET|EPIPE",
                          re.IGNORECASE)


def _wait_for_everyone(store: dist.Store, *, rank: int, world_size: int, timeout_s: float, where: str,
                       notice: WaitingNotice | None, stage: str = "joined") -> None:
    """A store-level head count within the init deadline: gloo's own mesh set-up would wait for a
    missing peer as long as a collective may take (collective_timeout_s), which is far too long here."""
    key = f"titan/{stage}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    joined = store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while True:
        if notice is not None:
            notice.joined = joined
        if joined >= world_size:
            return
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"rendezvous gave up after {timeout_s:g} s (parallelism.init_timeout_s): only {joined} of "
                f"WORLD_SIZE={world_size} processes {stage} at {where} (this is rank {rank}). Start all "
                f"{world_size} processes (titan-train --nproc-per-node N starts them for you), or unset "
                f"WORLD_SIZE to run a single process."
            )
        time.sleep(0.02)
        joined = store.add(key, 0)


def join_process_group(backend: str, *, init_timeout_s: float, collective_timeout_s: float) -> None:

    rank, _, world_size = rank_env()
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = env_int("MASTER_PORT", 29500, minimum=1)
    is_master = rank == 0 and not _uses_launcher_store()
    where = f"{host}:{port}"
    role = (f"the other {world_size - 1} process(es) of WORLD_SIZE={world_size} to connect" if is_master
            else "the rendezvous host (rank 0 or the launcher) to answer")
    # Every wait below can last init_timeout_s: the notice says so after a few seconds.
    with WaitingNotice(rank=rank, world_size=world_size, where=where, timeout_s=init_timeout_s, role=role) as notice:
        store = _meet(host, port, rank=rank, world_size=world_size, is_master=is_master,
                      init_timeout_s=init_timeout_s, notice=notice)
    started = time.monotonic()
    try:
        # A prefix per restart: an elastic restart reusing the launcher's store must not read the last attempt's keys.
        attempt = dist.PrefixStore(f"titan/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)
        dist.init_process_group(backend=backend, store=attempt, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
    except (dist.DistError, RuntimeError) as exc:
        raise _group_setup_failed(exc, rank=rank, world_size=world_size, where=where,
                                  waited_s=time.monotonic() - started, init_timeout_s=init_timeout_s) from None
    # Everyone's connections are up before anyone goes on (see the module docstring).
    _wait_for_everyone(store, rank=rank, world_size=world_size, timeout_s=init_timeout_s, where=where,
                       notice=None, stage="connected")
    store.set_timeout(datetime.timedelta(seconds=collective_timeout_s))


def _group_setup_failed(exc: BaseException, *, rank: int, world_size: int, where: str, waited_s: float,
                        init_timeout_s: float) -> Exception:
    """The error for a process group that could not be set up: a peer that went away, or one that never came."""
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    if _PEER_CLOSED.search(str(exc)):
        return PeerLost(
            f"rendezvous failed after {waited_s:.1f} s: another process closed its connection while the process "
            f"group was being set up at {where} (rank {rank} of WORLD_SIZE={world_size}; {detail}). That process "
            f"has probably stopped on an error of its own: look for its message, fix that, and rerun.",
            quiet=LAUNCHER_ENV in os.environ,  # the launcher prints the other process's error instead
        )
    return RendezvousError(
        f"rendezvous gave up after {waited_s:.0f} s (parallelism.init_timeout_s={init_timeout_s:g}): not every "
        f"one of the {world_size} processes joined the process group at {where} ({detail}). Start all "
        f"{world_size} processes, or unset WORLD_SIZE to run a single process."
    )


def _meet(host: str, port: int, *, rank: int, world_size: int, is_master: bool, init_timeout_s: float,
          notice: WaitingNotice) -> dist.TCPStore:
    """The store, once every process has joined it (within init_timeout_s)."""
    where = f"{host}:{port}"
    try:
        store = dist.TCPStore(host, port, world_size=world_size, is_master=is_master,
                              timeout=datetime.timedelta(seconds=init_timeout_s), wait_for_workers=is_master)
    except (dist.DistError, RuntimeError, OSError) as exc:
        who = ("the other processes did not all connect" if is_master
               else f"could not reach the rendezvous at {where}")
        raise RendezvousError(
            f"rendezvous gave up after {init_timeout_s:g} s (parallelism.init_timeout_s): {who} "
            f"(rank {rank} of WORLD_SIZE={world_size}; {str(exc).splitlines()[0][:200]}). Start all "
            f"{world_size} processes (titan-train --nproc-per-node N starts them for you), check MASTER_ADDR/"
            f"MASTER_PORT, or unset WORLD_SIZE to run a single process."
        ) from None
    try:
        _wait_for_everyone(store, rank=rank, world_size=world_size, timeout_s=init_timeout_s, where=where,
                           notice=notice)
    except dist.DistError as exc:  # the store's host went away while we waited
        raise RendezvousError(
            f"rendezvous failed: the store at {where} stopped answering ({str(exc).splitlines()[0][:200]}). "
            f"The process hosting it (rank 0 or the launcher) has probably died; look for its error."
        ) from None
    return store
