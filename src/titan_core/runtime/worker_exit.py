"""How a torchrun worker process ends: flushed, process groups destroyed, no interpreter teardown.

A 2-process run could print ``done`` and still exit 1 with ``terminate called without
an active exception`` (the message of a ``std::thread`` destroyed while still joinable).
What was measured (torch 2.13.0, gloo, CPU): after ``destroy_process_group()`` and a
``gc.collect()``, every worker still runs gloo's native threads, one ``gloo_tcp_loop``
and two ``pt_gloo_runloop`` per process group the run created (a TP run of a small
tied-embedding GPT: 5 and 10; FSDP2: 4 and 8). Neither ``gc.collect()`` nor clearing
torch's device-mesh cache ends them, so they are torn down at process exit, by
interpreter finalization and C++ static destructors, in an order nobody controls; that
teardown of live threads is the place the abort can come from. The abort itself
was not reproduced here (0 of 64 short 2-process TP runs with the old ``sys.exit`` path,
tiny and tied-embedding models, with and without a checkpoint each step), so the exact
destructor that fires it is unconfirmed.

The worker has nothing left to do once the training command returned, its process groups
are destroyed and its output is flushed, so it leaves with ``os._exit``: no static
destructor runs, and the live gloo threads die with the process instead of being
destroyed under it. A single process (no torchrun) exits normally.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_process(code: int) -> NoReturn:
    """Exit with ``code``; a torchrun worker skips interpreter finalization (see the module docstring)."""
    if not under_torchrun():
        sys.exit(code)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be written anyway
                pass
        os._exit(code)
