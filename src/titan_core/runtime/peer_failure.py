"""A collective that failed because another rank died or stopped answering: one clear message, exit 4.

gloo reports a dead peer as a closed connection and a frozen one as a timeout after
``parallelism.collective_timeout_s``; both arrive as ``torch.distributed.DistError``
(or a bare ``RuntimeError`` from the backend) somewhere deep in a step. Under the
``--nproc-per-node`` launcher the worker stays silent and the launcher, which can see
which process died or is stopped, prints the one message naming the rank.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from ..errors import PeerLost
from .launch_env import LAUNCHER_ENV, world_size_from_env

__all__ = ["is_collective_failure", "lost_peer"]

_BACKEND_HINTS = re.compile(r"gloo|nccl|Connection closed|Connection reset|Timed out|timed out|timeout|"
                            r"Broken pipe|DistBackendError|ProcessGroup", re.IGNORECASE)


def is_collective_failure(exc: BaseException) -> bool:
    """A failed collective of a multi-process run (a peer died or timed out)."""
    import torch.distributed as dist


    if world_size_from_env() <= 1:
        return False
    if isinstance(exc, dist.DistError):
        return True
    return type(exc) is RuntimeError and bool(_BACKEND_HINTS.search(str(exc)))


@contextlib.contextmanager
def lost_peer(parallelism: object) -> Iterator[None]:
    """Turn a failed collective (multi-process runs only) into PeerLost."""

    try:
        yield
    except (RuntimeError, OSError) as exc:
        if not is_collective_failure(exc):
            raise
        timeout = getattr(parallelism, "collective_timeout_s", None)
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise PeerLost(
            f"lost contact with another rank during a collective ({detail}): a rank died, or stopped answering "
            f"for parallelism.collective_timeout_s={timeout:g} s. Look for the first error of the other ranks; "
            f"checkpoints already published are intact, so rerunning the same command resumes from the last one.",
            quiet=LAUNCHER_ENV in os.environ,
        ) from exc
