#!/usr/bin/env bash
# Create .venv (if needed) and install titan-core and the four plugins from this checkout.
# torch==2.13.0 is installed first: a plain "torch>=2.13" with no torch present would pull a
# multi-GB CUDA build, while 2.13.0 has a CPU build on these machines. A torch already in
# .venv (e.g. your CUDA build) is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"

# Skip the reinstall when the sources are exactly what was installed last time.
stamp=$(find pyproject.toml README.md src plugins -type f -not -path '*/__pycache__/*' -print0 | sort -z \
        | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)
if [ "$(cat .venv/.titan-installed 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
# Non-editable installs: each package is built as a wheel by hatchling and installed, so entry
# points and package data are exercised exactly as users get them.
.venv/bin/python -m pip install -q ".[test,lint]" plugins/titan-llama plugins/titan-qwen3 plugins/titan-float8 plugins/titan-mx-prototype
# A re-run on a changed checkout must replace the previously built wheels of the same version.
.venv/bin/python -m pip install -q --force-reinstall --no-deps . plugins/titan-llama plugins/titan-qwen3 plugins/titan-float8 plugins/titan-mx-prototype
echo "$stamp" > .venv/.titan-installed
