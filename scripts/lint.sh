#!/usr/bin/env bash
# Lint and type-check: ruff over the whole tree, mypy (strict on src/titan_core, the plugins and
# examples held to less; settings in pyproject.toml), the import contracts (lint-imports), and the packages `titan-plugin new` writes,
# which must be clean as generated (ruff, mypy --strict): plugin authors start from them.
# CI runs this before the tests; any finding fails. Both tools are pinned in the "lint" extra
# that scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$SECONDS
.venv/bin/ruff check src plugins tests examples benchmarks scripts
.venv/bin/mypy
# The import contracts in pyproject.toml (layers, independence, no plugin imports), over the
# sources here rather than the installed wheel; --no-cache writes nothing into the checkout.
PYTHONPATH=src .venv/bin/lint-imports --no-cache --no-logo
scaffolds=$(mktemp -d)
trap 'rm -rf "$scaffolds"' EXIT
.venv/bin/titan-plugin new converter lintconv --dir "$scaffolds/titan-lintconv" > /dev/null
.venv/bin/titan-plugin new spec lintmodel --dir "$scaffolds/titan-lintmodel" > /dev/null
.venv/bin/ruff check --config pyproject.toml "$scaffolds"
.venv/bin/mypy --strict "$scaffolds/titan-lintconv/src" "$scaffolds/titan-lintmodel/src"
echo "lint: ruff, mypy and import contracts clean ($((SECONDS - start)) s)"
