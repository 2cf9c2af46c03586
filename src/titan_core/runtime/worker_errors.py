"""Under ``titan-train --nproc-per-node N``, a user error every rank hits is printed once, not N times.

A bad data path, a plugin that fails or an unwritable run folder stops every worker
with the same message. Each worker hands its one-line message to the launcher, its
parent, through a file in a private folder the launcher made (mode 0700, named in
``TITAN_LAUNCHER_ERRORS``); the launcher prints each distinct message once after the
workers have exited, naming the ranks only when their messages differ, and exits with
the workers' code. A message only one rank hits is printed all the same.

A worker writes there only when the folder is really its launcher's: the parent pid is
the one in ``TITAN_LAUNCHER_PID``, and the folder is a real folder of this user that
nobody else may read. Anything else (plain torchrun, a stale or forged variable) prints
the message itself as before. ``--traceback`` is unchanged: each worker prints its
own traceback where it happened.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from .launch_env import LAUNCHER_ENV

__all__ = ["ERRORS_ENV", "INTERRUPTED", "ErrorInbox", "hand_to_launcher", "under_launcher"]

ERRORS_ENV = "TITAN_LAUNCHER_ERRORS"
_MAX_MESSAGE = 64 << 10
#: The one line a Ctrl+C ends with. Under the launcher the launcher prints it, once, whichever
#: rank saw the KeyboardInterrupt first (the others may end on the lost peer instead).
INTERRUPTED = "titan-train: interrupted (SIGINT); checkpoints already published are intact"


def _launcher_folder() -> Path | None:
    raw = os.environ.get(ERRORS_ENV, "")
    if not raw:  # not under the launcher
        return None
    if os.environ.get(LAUNCHER_ENV, "").strip() != str(os.getppid()):
        return None
    try:
        st = os.lstat(raw)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return Path(raw)


def under_launcher() -> bool:
    """True in a worker of our own launcher (which then prints the worker's messages)."""
    return _launcher_folder() is not None


def hand_to_launcher(message: str, *, hint: bool) -> bool:
    """Leave ``message`` for the launcher to print; False when there is none (print it yourself)."""
    folder = _launcher_folder()
    rank = os.environ.get("RANK", "").strip()
    if folder is None or not rank.isdigit():
        return False
    tmp = folder / f".rank{rank}.tmp"
    try:
        tmp.write_text(json.dumps({"message": message[:_MAX_MESSAGE], "hint": hint}), encoding="utf-8")
        os.replace(tmp, folder / f"rank{int(rank)}.json")
    except OSError:
        return False
    return True


class ErrorInbox:
    """The launcher's side: the private folder, and the report of what its workers left there."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="titan-errors-"))  # 0700, this user's

    def env(self) -> dict[str, str]:
        return {ERRORS_ENV: str(self.folder)}

    def messages(self) -> tuple[dict[str, list[int]], bool]:
        """message -> ranks that reported it (in rank order), and whether any asked for the --traceback hint."""
        by_message: dict[str, list[int]] = {}
        hint = False
        for path in sorted(self.folder.glob("rank*.json"), key=lambda p: int(p.stem[4:] or 0)):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                message, wants_hint = str(record["message"]), bool(record.get("hint"))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            by_message.setdefault(message, []).append(int(path.stem[4:]))
            hint = hint or wants_hint
        return by_message, hint

    def report(self, nproc: int) -> int:
        """Print each distinct message once, naming its ranks unless all ``nproc`` said the same; how many."""
        by_message, hint = self.messages()
        for message, ranks in by_message.items():
            who = ""
            if len(ranks) != nproc:
                who = f"rank{'s' if len(ranks) > 1 else ''} {','.join(str(r) for r in ranks)}: "
            print(f"titan-train: error: {who}{message}", file=sys.stderr)
        if by_message and hint:
            print("(run with --traceback to see where it happened)", file=sys.stderr)
        sys.stderr.flush()
        return len(by_message)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
