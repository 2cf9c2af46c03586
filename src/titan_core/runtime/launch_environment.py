"""The launcher's environment (``WORLD_SIZE``, ``RANK``) checked against the command line, before anything starts.

Two mistakes used to cost minutes: ``WORLD_SIZE=2`` exported without ``RANK`` (by hand, or
left over from another job) made the process wait ``parallelism.init_timeout_s`` for peers
as rank 0; and ``--nproc-per-node`` under a launcher's environment (torchrun's, or the
variables exported in the shell) would either start workers inside workers or silently
ignore the flag. Both are one message and exit 2 at once.
"""

from __future__ import annotations

import os

from ..errors import ConfigError

__all__ = ["check_launch_environment"]


def _set(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value is not None and value.strip() != "" else None


def check_launch_environment(nproc_per_node: int | None) -> None:
    """Refuse WORLD_SIZE > 1 without RANK, and WORLD_SIZE/RANK set together with --nproc-per-node."""
    world, rank = _set("WORLD_SIZE"), _set("RANK")
    if nproc_per_node is not None and (world is not None or rank is not None):
        found = " and ".join(f"{n}={v}" for n, v in (("WORLD_SIZE", world), ("RANK", rank)) if v is not None)
        raise ConfigError(
            f"--nproc-per-node {nproc_per_node} starts its own {nproc_per_node} worker(s) and sets WORLD_SIZE and "
            f"RANK for them, but this process already has {found} in its environment (set by torchrun or another "
            f"launcher, or exported in the shell). Either unset them (env -u WORLD_SIZE -u RANK ...) to launch "
            f"with --nproc-per-node, or drop --nproc-per-node when a launcher such as torchrun starts the processes."
        )
    if world is not None and rank is None:
        try:
            many = 1 < int(world.strip()) <= 2**24
        except ValueError:
            many = False
        if many:  # 1 is a single process; garbage has its own message (launch_env.env_int)
            raise ConfigError(
                f"environment variable WORLD_SIZE={world} is set but RANK is not, so this process cannot know which "
                f"of the {world.strip()} processes it is (it would wait for the others as rank 0 until "
                f"parallelism.init_timeout_s). Launch through torchrun or titan-train --nproc-per-node, which set "
                f"both, or unset WORLD_SIZE to run a single process."
            )
