"""``titan-report RUN_DIR... [--out FILE.html]``: runs as one self-contained HTML page, plus a PNG of the loss.

One run: ``RUN_DIR/report.html`` by default (the file the run itself writes when it ends).
Several runs are overlaid on the same charts, with the settings that differ listed; they
need ``--out``. A fault-tolerance run folder (``--fault_tolerance.local_replicas``) is one report: its
replica groups overlaid, its failures and rejoins marked; the supervisor's ``.pid`` and lock files
that a ``RUN/replica_*`` glob also matches are left out with one line. The PNG (``FILE-loss.png`` beside the page) needs matplotlib (``plot`` extra);
without it the page is still written, and the message says how to get the PNG.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..observability.report import REPORT_FILE, write_report
from .tool_main import parse_and_run

PROG = "titan-report"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Draw runs (metrics.jsonl, config.toml) as one self-contained "
                                                      "HTML page and a PNG of the loss.")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="titan run folders (job.run_dir)")
    p.add_argument("--out", type=Path, default=None,
                   help="the HTML file to write (default with one run: RUN_DIR/report.html; required with several)")
    p.add_argument("--traceback", action="store_true", help="show Python tracebacks for errors")
    return p


# Files a run folder holds beside its runs (the fault-tolerance supervisor's process ids, the run lock): a shell
# glob such as RUN/replica_* matches them too; they are left out, not refused.
NOT_RUNS = (".pid", ".lock")


def runs_among(paths: list[Path]) -> list[Path]:
    """``paths`` without the process-id and lock files (one line names those left out)."""
    left_out = [p for p in paths if p.is_file() and (p.suffix in NOT_RUNS or p.name in NOT_RUNS)]
    shown = ", ".join(str(p) for p in left_out[:5]) + (", ..." if len(left_out) > 5 else "")
    if left_out:
        print(f"[{PROG}] left out {shown}: process-id or lock files, not run folders", file=sys.stderr, flush=True)
    kept = [p for p in paths if p not in left_out]
    if not kept:
        raise ConfigError(f"no run folder among {shown}; give titan run folders (job.run_dir), e.g. the "
                          "fault-tolerance run folder itself.")
    return kept


def refuse_repeats(runs: list[Path]) -> None:
    """ConfigError when two arguments name the same folder (run and ./run/, or a link to it): it would be
    drawn twice over itself, as if two runs agreed exactly."""
    seen: dict[Path, Path] = {}
    for path in runs:
        key = path.resolve()
        if key in seen:
            raise ConfigError(f"{path} names the run folder {key} a second time; give each run folder once "
                              "(the page would draw it twice over itself).")
        seen[key] = path


def report(args: argparse.Namespace) -> int:
    runs: list[Path] = runs_among(args.run_dirs)
    out: Path | None = args.out
    if out is None:
        if len(runs) > 1:
            raise ConfigError(f"{len(runs)} runs are overlaid on one page: name it with --out FILE.html.")
        out = runs[0] / REPORT_FILE
    if out.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--out {out} must end in .html (the PNG of the loss is written beside it).")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; name the HTML file to write, e.g. {out / REPORT_FILE}.")
    refuse_repeats(runs)
    written = write_report(runs, out)
    print(f"[{PROG}] wrote {written.html}", flush=True)
    if written.png is not None:
        print(f"[{PROG}] wrote {written.png}", flush=True)
    else:
        print(f"[{PROG}] warning: {written.note}", file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return parse_and_run(PROG, build_parser(), report, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
