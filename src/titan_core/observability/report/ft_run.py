"""A fault-tolerance run folder as one report: its replica groups, and what its supervisor recorded.

``titan-train --fault_tolerance.local_replicas=K --job.run_dir=RUN`` writes no metrics of its own:
each group is a run folder ``RUN/replica_<i>``, beside the supervisor's files (``replica_<i>.pid``,
``spare.pid``, ``lighthouse.pid``, ``lighthouse.log``, ``.lock``) and its record of membership
changes, ``ft_events.jsonl`` (runtime/ft_events.py). The marks and failure lines below come from
that record only, never from gaps in the curves: a gap can also be a logging interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...runtime.ft_events import FT_EVENTS_FILE, read_events
from .svg import Mark

GROUP_FOLDER = re.compile(r"replica_(\d+)")


@dataclass
class FtRun:
    folder: Path
    groups: list[Path]  # RUN/replica_<i>, in replica order
    events: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0  # lines of ft_events.jsonl that were not records (a killed supervisor's last line)


def group_folders(folder: Path) -> list[Path]:
    """The ``replica_<i>`` run folders of ``folder`` (not the ``.pid`` files beside them), by replica id."""
    try:
        found = [(int(m.group(1)), p) for p in folder.iterdir()
                 if (m := GROUP_FOLDER.fullmatch(p.name)) and p.is_dir() and (p / "metrics.jsonl").is_file()]
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def ft_run_of(folder: Path) -> FtRun | None:
    """The fault-tolerance run in ``folder``, or None when it is not one (it has no replica_<i> run folders,
    or it is a run folder itself); ConfigError for one whose groups have logged nothing yet."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / "metrics.jsonl").is_file():
        return None
    groups = group_folders(folder)
    if not groups:
        if (folder / FT_EVENTS_FILE).is_file():
            raise ConfigError(f"{folder} is a fault-tolerance run folder, but none of its replica groups has logged a "
                              "step yet (no replica_<i>/metrics.jsonl); draw it once a step is logged.")
        return None
    events, skipped = read_events(folder)
    return FtRun(folder, groups, events, skipped)


def events_of_group_folder(path: Path) -> FtRun | None:
    """For a ``replica_<i>`` folder given on its own (the ``RUN/replica_*`` glob): its parent's run, if any."""
    path = Path(path)
    if GROUP_FOLDER.fullmatch(path.resolve().name) and (path.parent / FT_EVENTS_FILE).is_file():
        return ft_run_of(path.parent)
    return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class Failure:
    """One death of one group, with what the supervisor saw after it."""

    replica: int
    how: str
    restart: int | None = None  # the restart it got (None: it was not restarted)
    max_restarts: int | None = None
    last_logged_step: int | None = None
    left_step: int | None = None  # the first step the others trained without it
    live: int | None = None  # how many groups trained that step
    groups: int | None = None
    rejoined_step: int | None = None
    peer: int | None = None
    after_s: float | None = None
    end: str = ""  # why it did not rejoin, when it did not


def failures(events: list[dict[str, Any]]) -> list[Failure]:
    """Each death, paired with the next 'left' and 'rejoined' (or why not) records of the same group."""
    out: list[Failure] = []
    open_by_replica: dict[int, Failure] = {}
    for e in events:
        kind, replica = e.get("event"), _int(e.get("replica"))
        if kind in ("died", "gave_up") and replica is not None:
            f = Failure(replica, str(e.get("how", "?")), last_logged_step=_int(e.get("last_logged_step")))
            if kind == "died":
                f.restart, f.max_restarts = _int(e.get("restart")), _int(e.get("max_restarts"))
                open_by_replica[replica] = f
            else:
                f.end = (f"it was not restarted: it had died {_int(e.get('restarts'))} time(s) before "
                         "(fault_tolerance.max_restarts) and the run stopped")
                open_by_replica.pop(replica, None)
            out.append(f)
        elif replica is not None and replica in open_by_replica:
            f = open_by_replica[replica]
            if kind == "left" and f.left_step is None:
                f.left_step, f.live, f.groups = _int(e.get("step")), _int(e.get("live")), _int(e.get("groups"))
            elif kind == "rejoined":
                f.rejoined_step, f.peer = _int(e.get("step")), _int(e.get("peer"))
                after = e.get("after_s")
                f.after_s = float(after) if isinstance(after, int | float) and not isinstance(after, bool) else None
                del open_by_replica[replica]
            elif kind == "nothing_to_rejoin":
                f.end = "it came back after the other groups had finished: nothing to rejoin"
                del open_by_replica[replica]
        elif kind == "start":  # a new supervisor in the same folder: what was open stays unexplained
            for f in open_by_replica.values():
                f.end = f.end or "the supervisor stopped before it rejoined"
            open_by_replica.clear()
    for f in open_by_replica.values():
        f.end = f.end or "no rejoin recorded (the run ended or the supervisor stopped first)"
    return out


def failure_line(f: Failure) -> str:
    """One sentence per failure, from the supervisor's records."""
    parts = [f"replica {f.replica} died ({f.how})"]
    if f.last_logged_step is not None:
        parts[0] += f" after step {f.last_logged_step} (the last step it logged)"
    if f.restart is not None:
        parts.append(f"restart {f.restart} of {f.max_restarts if f.max_restarts is not None else '?'}")
    back_at_once = f.rejoined_step is not None and (f.left_step is None or f.left_step >= f.rejoined_step)
    if back_at_once:  # the supervisor notes the leave at the rejoin step when no step committed without it
        parts.append("no step was trained without it")
    elif f.left_step is not None:
        who = f" by {f.live} of {f.groups} groups" if f.live is not None and f.groups is not None else ""
        until = f"-{f.rejoined_step - 1}" if f.rejoined_step is not None and f.rejoined_step - 1 > f.left_step else ""
        parts.append(f"step {f.left_step}{until} trained without it{who}")
    if f.rejoined_step is not None:
        peer = f" from replica {f.peer}" if f.peer is not None else ""
        after = f", {f.after_s:.1f}s after its restart" if f.after_s is not None else ""
        parts.append(f"rejoined at step {f.rejoined_step}{peer}{after}")
    if f.end:
        parts.append(f.end)
    return "; ".join(parts)


def other_lines(events: list[dict[str, Any]]) -> list[str]:
    """What is not a group's death: the lighthouse lost, a stopped process killed, the run's end code."""
    lines = []
    for e in events:
        kind = e.get("event")
        if kind == "lighthouse_lost":
            lines.append(f"the lighthouse died ({e.get('how', '?')}); every group stopped (exit 5)")
        elif kind == "frozen_killed":
            what = "the lighthouse" if e.get("what") == "lighthouse" else f"replica {e.get('replica')}"
            lines.append(f"{what} was stopped (SIGSTOP?) past fault_tolerance.quorum_timeout_s and was killed")
        elif kind == "end" and e.get("exit") != 0:
            lines.append(f"the supervisor ended with exit {e.get('exit')}")
    return lines


def replica_of(group: Path) -> int:
    match = GROUP_FOLDER.fullmatch(Path(group).resolve().name)
    return int(match.group(1)) if match else -1


def away_steps(events: list[dict[str, Any]], replica: int) -> list[float]:
    """The first step the others trained without ``replica``, for each of its deaths: its lines break there."""
    return [float(f.left_step) for f in failures(events) if f.replica == replica and f.left_step is not None]


def ft_marks(events: list[dict[str, Any]], *, prefix: str = "") -> list[Mark]:
    """Vertical lines on the loss chart: where each group left (the first step trained without it) and
    where it rejoined."""
    marks = []
    for f in failures(events):
        if f.left_step is not None:
            back_at_once = f.rejoined_step is not None and f.left_step >= f.rejoined_step
            training = "back before a step was trained without it" if back_at_once else \
                f"{f.live} of {f.groups} groups training"
            marks.append(Mark(float(f.left_step), "ft-left",
                              f"{prefix}step {f.left_step}: replica {f.replica} gone ({f.how}); {training}"))
        if f.rejoined_step is not None:
            marks.append(Mark(float(f.rejoined_step), "ft-rejoined",
                              f"{prefix}step {f.rejoined_step}: replica {f.replica} rejoined"
                              + (f" from replica {f.peer}" if f.peer is not None else "")))
    return marks


@dataclass
class Expanded:
    """What to draw: run folders with their names, and what the fault-tolerance runs among them add."""

    paths: list[Path]
    names: list[str]
    breaks: list[list[float]]  # per path: the steps its lines do not join across (its group was away)
    marks: list[Mark]  # on the loss chart
    sections: list[tuple[str, list[str]]]  # (a fault-tolerance run folder, its lines)


def expand_runs(paths: list[Path], names: list[str]) -> Expanded:
    """Each fault-tolerance run folder becomes its groups' run folders (one line each on every chart);
    a ``replica_<i>`` folder given on its own brings its parent's record of failures too."""
    out = Expanded([], [], [], [], [])
    seen: dict[Path, FtRun] = {}
    for path, name in zip(paths, names):
        ft = ft_run_of(path)
        if ft is not None:
            out.paths.extend(ft.groups)
            out.names.extend(g.name if len(paths) == 1 else f"{name}/{g.name}" for g in ft.groups)
            out.breaks.extend(away_steps(ft.events, replica_of(g)) for g in ft.groups)
        else:
            out.paths.append(path)
            out.names.append(name)
            ft = events_of_group_folder(path)
            out.breaks.append(away_steps(ft.events, replica_of(path)) if ft is not None else [])
        if ft is not None:
            seen.setdefault(ft.folder.resolve(), ft)
    for ft in seen.values():
        prefix = f"{ft.folder.name}: " if len(seen) > 1 else ""
        out.marks.extend(ft_marks(ft.events, prefix=prefix))
        lines = [failure_line(f) for f in failures(ft.events)] + other_lines(ft.events)
        if not any(e.get("event") == "start" for e in ft.events):
            lines.append(f"no {FT_EVENTS_FILE} records: a supervisor older than that file, or one that could not write "
                         "it; failures and rejoins are not marked")
        elif not lines:
            lines.append("no replica group died")
        if ft.skipped_lines:
            lines.append(f"{ft.skipped_lines} unreadable line(s) of {FT_EVENTS_FILE} skipped")
        out.sections.append((f"{ft.folder} ({len(ft.groups)} replica groups)", lines))
    return out
