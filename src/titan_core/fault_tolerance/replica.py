"""One replica group's torchft Manager: quorum, cross-group all-reduce, commit, live recovery.

The Manager talks to the lighthouse every step. Gradients are averaged over the
groups that are live in this step's quorum only; a group that is behind (it was
restarted) receives the state of a live peer over torchft's HTTP checkpoint
transport, read with ``weights_only=True`` so a peer can send tensors and plain
values but never code.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ..config.fault_tolerance import FaultToleranceSection, lighthouse_problem
from ..errors import ConfigError, LighthouseLost
from ..runtime.torch_compat import streaming_load

# Set by the local supervisor on a group it restarted (a group that must rejoin, never start alone).
RESTARTED_ENV = "TITAN_FT_RESTARTED"

# The lighthouse's address when fault_tolerance.lighthouse is empty (torchft's own variable).
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"


def _safe_http_transport(timeout: timedelta) -> Any:
    """torchft's HTTP transport, but loading what a peer sends with ``weights_only=True``."""
    import urllib.request

    from torchft.checkpointing.http_transport import HTTPTransport

    class SafeHTTPTransport(HTTPTransport):  # type: ignore[misc]
        @classmethod
        def _load_from_address(cls, address: str, timeout: timedelta) -> object:
            # torchft loads with weights_only=False (arbitrary pickles); our state is tensors and plain values.
            with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
                return streaming_load(f, weights_only=True)

    return SafeHTTPTransport(timeout=timeout, num_chunks=0)


class ReplicaGroup:
    """The torchft Manager of this process's replica group, and the few calls the trainer makes."""

    def __init__(self, ft: FaultToleranceSection, *, group_rank: int, group_world_size: int,
                 state_dict: Callable[[], dict[str, Any]], load_state_dict: Callable[[dict[str, Any]], None]) -> None:
        try:
            from torchft.manager import Manager
            from torchft.process_group import ProcessGroupGloo
        except ImportError as exc:
            raise ConfigError(f"fault_tolerance.enable=true needs torchft ({exc}); install titan-core[ft] "
                              "(pip install 'titan-core[ft]').") from None
        lighthouse = ft.lighthouse or os.environ.get(LIGHTHOUSE_ENV, "")
        if not lighthouse:
            raise ConfigError("fault_tolerance.enable=true needs the lighthouse's address: set "
                              "--fault_tolerance.lighthouse=http://HOST:PORT (or TORCHFT_LIGHTHOUSE), or start "
                              "a local demo with --fault_tolerance.local_replicas=K.")
        problem = lighthouse_problem(lighthouse)
        if problem:  # the section checked its own field; the variable is read only here
            raise ConfigError(f"{LIGHTHOUSE_ENV}={lighthouse!r} is not a lighthouse address: {problem}. Set it (or "
                              "--fault_tolerance.lighthouse) to http://HOST:PORT, the address torchft_lighthouse listens on.")
        self.config = ft
        # torchft logs every quorum, and every failed collective it recovers from (the step is retried); keep the console readable.
        logging.getLogger("torchft").setLevel(logging.CRITICAL)
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        timeout = timedelta(seconds=ft.quorum_timeout_s)
        store_addr, store_port, self._own_store = self._group_store(group_world_size)
        try:
            self.manager = self._manager(Manager, ProcessGroupGloo, ft, lighthouse, timeout, group_rank,
                                         group_world_size, store_addr, store_port, state_dict, load_state_dict)
        except RuntimeError as exc:  # the Rust client's connection error
            raise LighthouseLost(f"replica {ft.replica_id}: cannot reach the lighthouse at {lighthouse} within "
                                 f"fault_tolerance.quorum_timeout_s={ft.quorum_timeout_s:g}s ({exc}). Start the "
                                 "lighthouse (torchft_lighthouse --min_replicas N) or fix fault_tolerance.lighthouse.") from None
        self.healed_from: int | None = None

    @staticmethod
    def _manager(Manager: Callable[..., Any], ProcessGroupGloo: Callable[..., object], ft: FaultToleranceSection, lighthouse: str, timeout: timedelta,
                 group_rank: int, group_world_size: int, store_addr: str, store_port: int,
                 state_dict: Callable[[], dict[str, Any]], load_state_dict: Callable[[dict[str, Any]], None]) -> Any:
        # The collectives get their own, shorter timeout: when a group dies mid-step, a survivor whose ring
        # neighbour has already failed over waits on it until this runs out, and the lighthouse holds the next
        # quorum for that survivor meanwhile (seen as a 30 s stall with a single timeout).
        collective = timedelta(seconds=ft.collective_timeout_s)
        return Manager(
            pg=ProcessGroupGloo(timeout=collective), load_state_dict=load_state_dict, state_dict=state_dict,
            min_replica_size=ft.min_replicas, use_async_quorum=False, timeout=collective, quorum_timeout=timeout,
            connect_timeout=timeout, rank=group_rank, world_size=group_world_size, store_addr=store_addr,
            store_port=store_port, lighthouse_addr=lighthouse, replica_id=f"titan_replica_{ft.replica_id}",
            checkpoint_transport=_safe_http_transport(timeout),
            # At step 0 every group but one heals from that one: the weights match and the configs are compared.
            init_sync=True,
        )

    @staticmethod
    def _group_store(group_world_size: int) -> tuple[str, int, Any]:
        """torchrun's store for a multi-process group; a one-process group starts its own."""
        if group_world_size > 1:
            return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        return "127.0.0.1", int(store.port), store

    # ---- one step ---------------------------------------------------------------------------------
    def start_step(self) -> None:
        """Join this step's quorum. A group that is behind receives a live peer's state and loads it
        here, before its forward (the quorum is synchronous), so it then trains this step like the others."""
        self.manager.start_quorum()

    def average(self, tensors: list[torch.Tensor], *, absent: int = 0) -> None:
        """Average in place over the groups live in this step (a healing group contributes zeros).

        ``absent``: live groups that contribute zeros and are not counted (the test-only rehearsal of
        a failure, rehearsal.py). The sum is divided here, as torchft's average would divide it."""
        if not tensors:
            return
        from torch.distributed import ReduceOp

        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
        flat /= max(1, self.participants - absent)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n

    def commit(self) -> bool:
        """True when every live group finished the step and enough of them are live (torchft's should_commit)."""
        return bool(self.manager.should_commit())

    @property
    def participants(self) -> int:
        return int(self.manager.num_participants())

    @property
    def step(self) -> int:
        return int(self.manager.current_step())

    def set_step(self, step: int) -> None:
        """After a resume from a checkpoint: the quorum compares steps to find who is behind."""
        self.manager.load_state_dict({"step": step, "batches_committed": step * self.config.group_size})

    def errored(self) -> str | None:
        err = self.manager.errored()
        return None if err is None else str(err.original_exception)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def hostname() -> str:
    return socket.gethostname()
