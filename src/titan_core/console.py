"""Status lines a rank prints to the terminal, marked with the rank in a multi-process run.

Used from set-up, error reports and the launcher, so it imports nothing of the package.
"""

from __future__ import annotations

import os
import sys


def progress(message: str, *, is_rank0: bool) -> None:
    """A short status line so nobody stares at a silent terminal during set-up."""
    if is_rank0:
        say(f"{rank_prefix()}[titan] {message}")


def say(*lines: str) -> None:
    """Write whole lines to stderr in one call.

    ``print`` writes the text and its newline separately, so two ranks sharing a pipe can splice their
    lines together; one short write to a pipe is atomic.
    """
    sys.stderr.write("".join(f"{line}\n" for line in lines))
    sys.stderr.flush()


def env_is_rank0() -> bool:
    """Whether this process is rank 0 by the launcher's RANK (unset: a single process), for lines only one
    rank should print before the process group exists. Never raises: garbage RANK is reported elsewhere."""
    return os.environ.get("RANK", "0").strip() in ("0", "")


def rank_prefix() -> str:
    """``[rank3] `` in a multi-process run, so interleaved output says who wrote it."""
    world, rank = os.environ.get("WORLD_SIZE", "1").strip(), os.environ.get("RANK", "?").strip()
    # Used while reporting errors, including a garbage WORLD_SIZE: never raise here.
    return f"[rank{rank[:8]}] " if world.isdigit() and int(world) > 1 else ""
