#!/usr/bin/env bash
# Set up, then train the debugmodel on the built-in corpus (nothing is downloaded; CPU is fine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/titan-train --spec llama3 --flavor debugmodel --training.steps=300 --job.run_dir=runs/quickstart "$@"
