"""``titan-plugin``: tools for plugin authors. ``check`` runs the conformance kit, ``new`` scaffolds a package."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from ..errors import ConfigError, Terminated, TitanError
from ..plugin.discovery import import_modules
from ..plugin.guard import set_plugin_timeout
from ..runtime.os_errors import describe_os_error
from ..runtime.signals import sigterm_raises
from ..scaffold import write_package


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="titan-plugin", description="Tools for titan-core plugin authors.")
    p.add_argument("--traceback", action="store_true", help="show Python tracebacks for errors")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="run the conformance checks on installed converters / specs")
    c.add_argument("names", nargs="+", metavar="NAME", help="entry-point names (specs or converters)")
    c.add_argument("--fast", action="store_true", help="only the quick checks (under a minute)")
    c.add_argument("--spec", default="tiny", help="spec converters are trained on (default: the core's tiny model)")
    c.add_argument("--flavor", help="flavor to train (default: debugmodel, else the spec's default flavor, else "
                                    "its smallest)")
    c.add_argument("--compile", action="store_true", help="also train with --compile.enable=true (with --fast too)")
    c.add_argument("--kind", choices=["spec", "converter"], help="what NAME is, when both kinds have it")
    c.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first, here and in every training run (plugins registered in-process)")
    c.add_argument("--call-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="longest one call into the plugin may take (select, convert, a forward, ...) before its "
                        "check fails; passed to the training runs as --model.plugin_timeout_s (default 300)")
    c.add_argument("--flag", dest="flags", action="append", default=[], metavar="--SECTION.KEY=VALUE",
                   help="extra titan-train flag for every training run (repeatable)")
    n = sub.add_parser("new", help="write a new plugin package")
    n.add_argument("kind", choices=["converter", "spec"])
    n.add_argument("name", help="the entry-point name (a Python identifier, lower case)")
    n.add_argument("--dir", required=True, help="folder to write the package into (must not exist or be empty)")
    return p


def _flag_values_joined(argv: list[str]) -> list[str]:
    """``--flag --training.steps=5`` as ``--flag=--training.steps=5``: the value is itself a flag, which argparse
    would otherwise take for an option of its own ("expected one argument")."""
    joined: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--flag" and i + 1 < len(argv) and argv[i + 1].startswith("--") and argv[i + 1] != "--":
            joined.append(f"--flag={argv[i + 1]}")
            i += 2
            continue
        joined.append(argv[i])
        i += 1
    return joined


def _refuse_non_flags(flags: Sequence[object]) -> None:
    """Each --flag is handed to every training run as one titan-train argument: something that is not a flag there
    failed only at the check that first trained, after the quick checks had passed."""
    for flag in flags:
        if not isinstance(flag, str):  # argparse hands "--flag=--" over as an empty list
            flag = "--"
        if not flag.startswith("--") or len(flag) == 2:
            raise ConfigError(f"--flag {flag!r}: not a titan-train flag; give one --SECTION.KEY=VALUE per --flag, "
                              f"e.g. --flag --training.steps=10.")


def main(argv: Sequence[str] | None = None) -> int:
    argv = _flag_values_joined(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    try:
        with sigterm_raises():
            return _run(args)
    except TitanError as exc:
        if args.traceback:
            traceback.print_exc()
        print(f"titan-plugin: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # the --dir of `new`, a temporary folder of `check`: a message naming the path
        if args.traceback:
            traceback.print_exc()
        print(f"titan-plugin: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("titan-plugin: interrupted (SIGINT); no results", file=sys.stderr)
        return 130
    except Terminated:
        print("titan-plugin: stopped by SIGTERM; no results", file=sys.stderr)
        return 143


def _run(args: argparse.Namespace) -> int:
    if args.command == "check":
        import math

        from .plugin_check import check  # start-up: `titan-plugin new` needs no torch

        if not (math.isfinite(args.call_timeout) and 0 < args.call_timeout <= 604800):
            raise ConfigError(f"--call-timeout {args.call_timeout!r}: give the seconds one plugin call may take, a "
                              f"finite number above 0 (at most 604800, a week), e.g. --call-timeout 300.")
        _refuse_non_flags(args.flags)
        set_plugin_timeout(args.call_timeout)
        import_modules(args.imports)
        imports = [flag for module in args.imports for flag in ("--import", module)]
        limit = [f"--model.plugin_timeout_s={args.call_timeout!r}"]
        return check(args.names, fast=args.fast, spec=args.spec, compile=args.compile, kind=args.kind,
                     extra_flags=[*imports, *limit, *args.flags], flavor=args.flavor, user_flags=args.flags)

    path = write_package(args.kind, args.name, args.dir)
    print(f"wrote {args.kind} plugin {args.name} to {path}\nnext: pip install {path} && "
          f"titan-plugin check {args.name}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
