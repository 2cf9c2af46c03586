"""CPU threads per process: the machine's cores shared among the ranks on it, never more.

torch gives every process all the cores by default; N ranks on one machine then run N times as
many threads as there are cores, and under any other load a step takes several times longer
(seen: 20 steps in 84-214 s against 23-25 s with one thread per rank). Each rank takes its share,
cores // LOCAL_WORLD_SIZE (at least 1), unless OMP_NUM_THREADS says otherwise; the start-up line says
which, and why.
"""

from __future__ import annotations

import os

import torch

from .launch_env import env_int

__all__ = ["choose_cpu_threads", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def choose_cpu_threads() -> str:
    """Set torch's intra-op threads for this rank; the words for the start-up line (``2 threads (...)``)."""
    told = os.environ.get("OMP_NUM_THREADS", "").strip()
    if told.isdigit() and int(told) > 0:
        n = torch.get_num_threads()
        return f"{n} thread{'s' if n > 1 else ''} (OMP_NUM_THREADS={told})"
    cores, local = usable_cores(), env_int("LOCAL_WORLD_SIZE", 1, minimum=1)
    n = max(1, cores // local)
    torch.set_num_threads(n)
    share = f"{cores} core{'s' if cores > 1 else ''} / {local} rank{'s' if local > 1 else ''} on this machine"
    return f"{n} thread{'s' if n > 1 else ''} per process ({share}; OMP_NUM_THREADS overrides)"
