"""The fault-tolerance supervisor's own record of membership changes: ``<run_dir>/ft_events.jsonl``.

One JSON object per line, written by the supervisor when it prints the matching ``[ft]`` line
(a group died, the first step the others trained without it, its rejoin, a group that gave up,
the lighthouse lost), and read by ``titan-report`` to mark failures and rejoins on the groups'
curves. Lines are appended and flushed one by one, so a killed supervisor leaves every record
before its death; a run started again in the same folder appends after a new ``start`` record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..console import say
from .regular_files import read_record_lines, refuse_fifo

FT_EVENTS_FILE = "ft_events.jsonl"


def append_event(run_dir: Path, event: str, **fields: object) -> None:
    """Add one record; a write that fails is one warning, never the end of the run (the groups train on)."""
    record = {"event": event, "time": round(time.time(), 3), **fields}
    path = Path(run_dir) / FT_EVENTS_FILE
    try:
        refuse_fifo(path)  # a FIFO would hold the supervisor in open() for good
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:
        say(f"[ft] warning: could not record '{event}' in {path} ({exc.strerror or exc}); the run goes on, "
            "but titan-report will not mark this change")


def read_events(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """(the records in order, how many lines were not records: a line cut by a killed supervisor)."""
    path = Path(run_dir) / FT_EVENTS_FILE
    events: list[dict[str, Any]] = []
    skipped = 0
    try:
        lines = read_record_lines(path)
    except OSError:  # none yet, or not a regular file (never waited on)
        return [], 0
    for raw in lines:
        try:
            if raw is None:  # longer than any record: not one
                raise ValueError(raw)
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            skipped += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            events.append(record)
        else:
            skipped += 1
    return events, skipped
