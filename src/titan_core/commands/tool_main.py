"""The error handling every one-shot console tool shares (titan-convert, titan-generate, titan-report).

A bad input is one line ``<prog>: error: ...`` and the error's exit code (2), with the
traceback only under ``--traceback``; Ctrl+C exits 130 and SIGTERM 143, each with one line.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from ..errors import Terminated, TitanError
from ..runtime.os_errors import describe_os_error
from ..runtime.path_settings import forget_paths
from ..runtime.signals import sigterm_raises


def run_tool(prog: str, command: Callable[[argparse.Namespace], int], args: argparse.Namespace, *,
             on_stop: str = "") -> int:
    """``command(args)``, with the project's exits for user errors and signals (see the module docstring);
    ``on_stop`` is added to the line printed on Ctrl+C or SIGTERM (what was kept, how to continue)."""
    note = f"; {on_stop}" if on_stop else ""
    forget_paths()  # an error names this tool's flags (the command registers them), never an earlier command's
    try:
        with sigterm_raises():
            return command(args)
    except (TitanError, OSError) as exc:
        error = describe_os_error(exc) if isinstance(exc, OSError) else exc
        if args.traceback:
            traceback.print_exc()
        print(f"{prog}: error: {error}", file=sys.stderr)
        if not args.traceback:
            print("(run with --traceback to see where it happened)", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted{note}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"{prog}: stopped by SIGTERM{note}", file=sys.stderr)
        return 143


def parse_and_run(prog: str, parser: argparse.ArgumentParser, command: Callable[[argparse.Namespace], int],
                  argv: Sequence[str] | None) -> int:
    """A tool's ``main``: parse ``argv`` (the command line when None), then ``run_tool``."""
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_tool(prog, command, args)
