#!/usr/bin/env bash
# Set up, then run the whole test suite. Exit code 5 (no tests collected) counts as failure.
# --fast: only the fast tier (units, one short end-to-end run, one 2-process run; <= 5 min on
# 2 cores), for the edit-test loop. CI runs everything. Other arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then args+=(-m fast); else args+=("$arg"); fi
done
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest -q --durations=30 ${args[@]+"${args[@]}"}
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
