"""How a torchrun worker process ends: flushed, process groups destroyed, no interpreter teardown.

A 2-process run could print ``done`` and still exit 1 with ``terminate called without
an active exception``: the C++ side of torch.distributed (gloo's worker threads, the
store client, thread pools) is torn down by static destructors during interpreter
finalization, after Python has started dismantling the objects those threads still
reference, and a ``std::thread`` destroyed while joinable aborts the process. The
worker has nothing left to do once the training command returned, its process groups
are destroyed and its output is flushed, so it leaves with ``os._exit`` and skips that
teardown; a single process (no torchrun) exits normally.
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
