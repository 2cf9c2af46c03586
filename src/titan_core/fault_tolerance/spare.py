"""A spare replica-group process for the local supervisor: started ahead, it has already paid for
the interpreter, ``import torch`` and titan's imports (about half of a restart on a loaded
machine), and waits on stdin for the command of the group it replaces.

The supervisor writes one JSON line, ``{"argv": [...], "env": {...}}``; the spare takes that
environment and runs ``titan_core`` as ``__main__`` with that argv: what ``python -m titan_core
ARGV`` runs, in this process.
"""

from __future__ import annotations

import json
import os
import runpy
import sys


def main() -> None:
    # The imports a replica group needs before its first quorum, done while the spare waits.
    import torch  # noqa: F401
    import torchft.manager  # noqa: F401

    from ..plan import resolve  # noqa: F401  (warm-up: importing these while waiting is the spare's job)
    from . import trainer  # noqa: F401  (warm-up: as above)

    line = sys.stdin.readline()
    if not line:  # the supervisor ended without needing this spare
        return
    order = json.loads(line)
    os.environ.update({str(k): str(v) for k, v in order["env"].items()})
    sys.argv = [sys.argv[0], *(str(a) for a in order["argv"])]
    # What `python -m titan_core ARGV` runs (titan_core/__main__.py), in this process.
    runpy.run_module("titan_core", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
