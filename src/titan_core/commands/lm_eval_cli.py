"""``titan-lm-eval ARGS``: lm-evaluation-harness's own command line, with titan's model registered as ``titan``.

lm_eval 0.4 finds a model name in its own table of models or among the classes registered in the
running process; it loads no plugin, so a plain ``lm_eval --model titan`` cannot see titan's
adapter. This command registers it (``lm_eval_model``) and hands every argument to lm_eval's CLI
unchanged: ``titan-lm-eval --model titan --model_args checkpoint=PATH --tasks ...``.

A missing lm_eval, or a model argument or checkpoint that cannot be used, is one line and exit 2
(the traceback with ``--traceback``); lm_eval's own errors are its own.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence

from ..errors import ConfigError
from .tool_main import run_tool

PROG = "titan-lm-eval"
INSTALL = "pip install 'titan-core[lmeval]'"


def run_lm_eval(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("lm_eval") is None:
        raise ConfigError(f"lm-evaluation-harness (the lm_eval module) is not installed; {INSTALL} adds it.")
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_model  # noqa: F401  an optional dependency: imports lm_eval, registers the model "titan"

    saved = sys.argv
    sys.argv = [PROG, *args.lm_eval_args]  # lm_eval's CLI reads sys.argv itself
    try:
        cli_evaluate()
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = argparse.Namespace(lm_eval_args=[a for a in given if a != "--traceback"], traceback="--traceback" in given)
    return run_tool(PROG, run_lm_eval, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
