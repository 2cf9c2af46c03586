#!/usr/bin/env bash
# Set up, train the debugmodel on the built-in corpus (nothing is downloaded; CPU is fine), then show
# the run: the path of its report (every metric against steps, in one HTML file) and a greedy
# continuation of a fixed prompt by the model just trained. Arguments go to titan-train after these
# defaults, and later flags win (e.g. --training.steps=50 --job.run_dir=runs/mine).
set -euo pipefail
cd "$(dirname "$0")/.."
TITAN_SETUP_VERBOSE=${TITAN_SETUP_VERBOSE:-1} bash scripts/setup.sh

run_dir=runs/quickstart
previous=""
for arg in "$@"; do  # the run folder, as titan-train will read it (--job.run_dir=X or --job.run_dir X)
  case "$arg" in --job.run_dir=*) run_dir=${arg#--job.run_dir=} ;; esac
  if [ "$previous" = "--job.run_dir" ]; then run_dir=$arg; fi
  previous=$arg
done

# --eval.tasks=builtin: the built-in tasks scored every 50 steps, drawn in the report (docs/evaluation.md).
.venv/bin/titan-train --spec llama3 --flavor debugmodel --training.steps=300 --job.run_dir=runs/quickstart \
  --checkpoint.enable=true --eval.tasks=builtin --eval.interval=50 "$@"

prompt='The "for" statement'
echo
if [ -f "$run_dir/report.html" ]; then
  echo "Report (open it in a browser): $run_dir/report.html"
else
  echo "No report in $run_dir (metrics.report=false); draw one with: .venv/bin/titan-report $run_dir"
fi
echo "A greedy continuation of '$prompt' by the model just trained (.venv/bin/titan-generate $run_dir --prompt ...)."
.venv/bin/titan-generate "$run_dir" --prompt "$prompt" --max-new-tokens 48
echo
echo "What to expect: the default 300 steps of a 6-million-parameter model (its loss starts near 8,"
echo "falling fast, then slowly; the run's 'final loss' is the mean of its last 10 steps) learn the corpus's commonest words and"
echo "punctuation, not language: the text above is not fluent, and greedy decoding of so young a model"
echo "usually repeats a few frequent words or one phrase. That is a working run; fluent text needs a larger"
echo "model and far more tokens (docs/seeing-a-run.md)."
