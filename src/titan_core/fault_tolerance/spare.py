"""A spare replica-group process for the local supervisor: started ahead, it has already paid for
the interpreter, ``import torch`` and titan's imports (about half of a restart on a loaded
machine), and waits on stdin for the command of the group it replaces.

The supervisor writes one JSON line, ``{"argv": [...], "env": {...}}``; the spare takes that
environment and runs ``titan-train ARGV`` in this process, as ``python -m titan_core ARGV`` would.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    # The imports a replica group needs before its first quorum, done while the spare waits.
    import torch  # noqa: F401
    import torchft.manager  # noqa: F401

    from .. import cli
    from . import trainer  # noqa: F401
    from ..worker_exit import exit_process

    line = sys.stdin.readline()
    if not line:  # the supervisor ended without needing this spare
        return
    order = json.loads(line)
    os.environ.update({str(k): str(v) for k, v in order["env"].items()})
    argv = [str(a) for a in order["argv"]]
    sys.argv = [sys.argv[0], *argv]
    exit_process(cli.main(argv))


if __name__ == "__main__":
    main()
