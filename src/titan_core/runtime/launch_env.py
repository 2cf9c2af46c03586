"""What the launcher (torchrun or ``titan-train --nproc-per-node``) says through the environment.

Read before any process group exists, by the CLI, the config's resolution and the failure
reports alike, so it sits below all of them and imports nothing heavier than the errors.
"""

from __future__ import annotations

import os

from ..errors import ConfigError

# Set by titan-train --nproc-per-node in its workers (its own pid).
LAUNCHER_ENV = "TITAN_LAUNCHER_PID"


def world_size_from_env() -> int:
    """The world size torchrun announced (1 outside torchrun): known before any process group."""
    return env_int("WORLD_SIZE", 1, minimum=1)


_MAX_PROCESSES = 2**24  # far beyond any job; bounds what torch's store and gloo are handed


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    """An integer from the launcher's environment, checked: garbage there is a clear error, not a traceback."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum or value > _MAX_PROCESSES:
        bound = f">= {minimum}" if value is None or value < minimum else f"up to {_MAX_PROCESSES}"
        raise ConfigError(
            f"environment variable {name}={raw!r} is not an integer {bound}. It is set by the launcher "
            f"(torchrun or titan-train --nproc-per-node); unset it to run a single process, or launch through "
            f"one of those."
        )
    return value


def rank_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the environment, each checked against the others."""
    world_size = world_size_from_env()
    rank = env_int("RANK", 0)
    local_rank = env_int("LOCAL_RANK", 0)
    env_int("LOCAL_WORLD_SIZE", 1, minimum=1)  # read by the memory check: garbage there is the same error
    if rank >= world_size:
        raise ConfigError(f"environment variable RANK={rank} must be below WORLD_SIZE={world_size}; "
                          f"launch through torchrun or titan-train --nproc-per-node, which set both.")
    return rank, local_rank, world_size
