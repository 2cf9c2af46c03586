#!/usr/bin/env bash
# Create .venv (if needed) and install titan-core and the five plugins from this checkout.
# torch==2.13.0 is installed first: a plain "torch>=2.13" with no torch present would pull a
# multi-GB CUDA build, while 2.13.0 has a CPU build on these machines. A torch already in
# .venv (e.g. your CUDA build) is kept.
# Output: one line per stage that does work. pip's own progress is shown when attached to a
# terminal or with TITAN_SETUP_VERBOSE=1 (the quickstart sets it); otherwise (CI, lint, tests) pip
# is quiet, and TITAN_SETUP_VERBOSE=0 makes it quiet on a terminal too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
verbose=${TITAN_SETUP_VERBOSE:-}
if [ -z "$verbose" ]; then
  if [ -t 1 ]; then verbose=1; else verbose=0; fi
fi
quiet=(-q)
if [ "$verbose" = 1 ]; then quiet=(); fi
say() { echo "[setup] $*"; }
start=$SECONDS

fresh=0
if [ ! -x .venv/bin/python ]; then
  fresh=1
  say "creating .venv with $("$PY" --version 2>&1) and upgrading pip in it"
  "$PY" -m venv .venv
  .venv/bin/python -m pip install ${quiet[@]+"${quiet[@]}"} --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  say "installing torch==2.13.0 (the biggest download; a CPU build where the machine has one)"
  .venv/bin/python -m pip install ${quiet[@]+"${quiet[@]}"} "torch==2.13.0"
fi

# Skip the reinstall when the sources are exactly what was installed last time.
stamp=$(find pyproject.toml README.md src plugins -type f -not -path '*/__pycache__/*' -print0 | sort -z \
        | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)
if [ "$(cat .venv/.titan-installed 2>/dev/null)" = "$stamp" ]; then
  if [ "$verbose" = 1 ]; then say ".venv is up to date with this checkout"; fi
  exit 0
fi
# Non-editable installs: each package is built as a wheel by hatchling and installed, so entry
# points and package data are exercised exactly as users get them.
say "building titan-core and the five plugins as wheels and installing them with the test and lint tools"
.venv/bin/python -m pip install ${quiet[@]+"${quiet[@]}"} ".[test,lint]" plugins/titan-llama plugins/titan-qwen3 plugins/titan-deepseek plugins/titan-float8 \
  plugins/titan-mx-prototype
# A re-run on a changed checkout must replace the previously built wheels of the same version (a .venv
# made just now holds no earlier build: the install above built these sources).
if [ "$fresh" = 0 ]; then
  say "reinstalling this checkout's six wheels over any earlier build of the same version"
  .venv/bin/python -m pip install ${quiet[@]+"${quiet[@]}"} --force-reinstall --no-deps . plugins/titan-llama \
    plugins/titan-qwen3 plugins/titan-deepseek plugins/titan-float8 plugins/titan-mx-prototype
fi
echo "$stamp" > .venv/.titan-installed
say "done in $((SECONDS - start)) s"
