#!/usr/bin/env bash
# Lint and type-check: ruff over the whole tree, mypy (strict on src/titan_core, the plugins and
# examples held to less; settings in pyproject.toml). CI runs it before the tests; any finding
# fails. Both tools are pinned in the "lint" extra that scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$SECONDS
.venv/bin/ruff check src plugins tests examples benchmarks scripts
.venv/bin/mypy
echo "lint: ruff and mypy clean ($((SECONDS - start)) s)"
