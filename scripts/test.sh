#!/usr/bin/env bash
# Set up, then run the whole test suite. Exit code 5 (no tests collected) counts as failure.
# --fast: only the fast tier (units, one short end-to-end run, one 2-process run; <= 3 min on
# 2 cores), for the edit-test loop. CI runs everything. Other arguments go to pytest.
# Test files run on TITAN_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this process):
# most tests wait on a process start or on Python, not on both cores, so two at a time nearly halve
# the suite on 2 cores. A file's tests stay together on one worker (--dist loadfile): they share
# module fixtures such as a trained run folder.
set -uo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then args+=(-m fast); else args+=("$arg"); fi
done
bash scripts/setup.sh || exit 1
workers=${TITAN_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadfile); fi
.venv/bin/python -m pytest -q --durations=30 ${parallel[@]+"${parallel[@]}"} ${args[@]+"${args[@]}"}
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
