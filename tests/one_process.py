"""Several runs of one command-line tool in one fresh process: ``module.main(argv)`` for each argv in turn.

For refusals that are decided before any work starts (flags, configs, folders): each is the tool's own
``main`` with its exit code, stdout and stderr, as in a process of its own, but the cases share one
interpreter start-up (importing torch is most of a refused command's time) instead of paying one each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Prints a JSON list of [exit code, stdout, stderr]; an exception escaping main is printed as a traceback
# into that case's stderr (exit code 1), as the interpreter would.
_DRIVER = """
import contextlib, importlib, io, json, sys, traceback
main = importlib.import_module(sys.argv[1]).main
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def run_in_one_process(commands: list[tuple[str, ...]], *, module: str, env: dict[str, str], cwd: Path,
                       timeout: float = 300, python: str = sys.executable) -> list[subprocess.CompletedProcess[str]]:
    """Each command's ``module.main(args)``, one after the other in one fresh ``python`` process (this
    interpreter unless named, e.g. another venv's); their results in order."""
    proc = subprocess.run([python, "-c", _DRIVER, module, json.dumps(commands)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [subprocess.CompletedProcess(list(args), code, out, err)
            for args, (code, out, err) in zip(commands, json.loads(proc.stdout), strict=True)]
