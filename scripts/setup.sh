#!/usr/bin/env bash
# Create .venv (if needed) and install titan-core and the three plugins from this checkout.
# torch==2.13.0 is installed first: a plain "torch>=2.13" with no torch present would pull a
# multi-GB CUDA build, while 2.13.0 has a CPU build on these machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
# Non-editable installs: each package is built as a wheel by hatchling and installed, so entry
# points are exercised exactly as users get them.
.venv/bin/python -m pip install -q ".[test]" plugins/titan-llama plugins/titan-float8 plugins/titan-mx-prototype
# A re-run on a changed checkout must replace the previously built wheels.
.venv/bin/python -m pip install -q --force-reinstall --no-deps . plugins/titan-llama plugins/titan-float8 plugins/titan-mx-prototype
