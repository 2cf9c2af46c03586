"""``titan-eval SOURCE --tasks T ...``: the ``[eval]`` tasks scored outside training.

SOURCE is what titan-generate reads: a titan checkpoint (a ``step-N`` folder, from any layout:
read on one process), a run folder (its newest checkpoint) or a Hugging Face folder. The figures
are those ``[eval]`` logs during training (``eval/<task>/acc``, ...), printed as one JSON object on
stdout (and written to ``--output``); what was loaded goes to stderr. The forward runs in float32.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import ConfigError
from ..evaluation import evaluate, format_results, load_tasks, prepare_tasks
from ..runtime.run_files import atomic_write_text
from ..train.evaluation import model_window
from .model_source import add_model_source_arguments, load_model_source
from .tool_main import parse_and_run

PROG = "titan-eval"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Score evaluation tasks (docs/evaluation.md) on a titan "
                                                      "checkpoint or a Hugging Face folder.")
    add_model_source_arguments(p)
    p.add_argument("--tasks", nargs="+", required=True,
                   help="JSONL task files, 'builtin' (every built-in task) or 'builtin:NAME'")
    p.add_argument("--limit", type=int, default=None, help="score only the first N examples of each task")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    p.add_argument("--output", type=Path, default=None, help="also write the figures to this JSON file")
    return p


def run_eval(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit <= 0:
        raise ConfigError(f"--limit must be a positive number of examples, got {args.limit}; leave it out for all.")
    if args.batch_size <= 0:
        raise ConfigError(f"--batch-size must be a positive number of sequences, got {args.batch_size}.")
    tasks = [t.limited(args.limit) for t in load_tasks(args.tasks)]  # a bad file stops before any weight is read
    loaded = load_model_source(args, prog=PROG)
    whole, model = loaded.whole, loaded.model
    window = model_window(whole.model_args, 2048)
    prepared = prepare_tasks(tasks, whole.tokenizer, window=window)
    print(f"[{PROG}] {loaded.describe()}: {', '.join(f'{t.name} ({len(t.examples)})' for t in tasks)}",
          file=sys.stderr, flush=True)
    model.eval()
    with torch.no_grad():
        results = evaluate(prepared, model, window=window, batch_size=args.batch_size, device=loaded.device)
    print(f"[{PROG}] {format_results(results)}", file=sys.stderr)
    text = json.dumps(results, indent=1)
    if args.output is not None:
        atomic_write_text(args.output, text + "\n")
    print(text, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return parse_and_run(PROG, build_parser(), run_eval, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
