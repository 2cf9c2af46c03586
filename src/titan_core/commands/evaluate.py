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
from ..runtime.folder_kinds import is_hf_folder, is_titan_checkpoint
from ..runtime.run_files import atomic_write_text
from ..train.evaluation import model_window
from .model_source import add_model_source_arguments, load_model_source
from .tool_main import parse_and_run

PROG = "titan-eval"
# A results file is a few lines per task; anything larger is not one, and is not read whole to find that out.
RESULTS_MAX_BYTES = 1 << 20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Score evaluation tasks (docs/evaluation.md) on a titan "
                                                      "checkpoint or a Hugging Face folder.")
    add_model_source_arguments(p)
    p.add_argument("--tasks", nargs="+", required=True,
                   help="JSONL task files, 'builtin' (every built-in task) or 'builtin:NAME'")
    p.add_argument("--limit", type=int, default=None, help="score only the first N examples of each task")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    p.add_argument("--output", type=Path, default=None,
                   help="also write the figures to this JSON file (new, or an earlier titan-eval result to replace)")
    return p


def run_eval(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit <= 0:
        raise ConfigError(f"--limit must be a positive number of examples, got {args.limit}; leave it out for all.")
    if args.batch_size <= 0:
        raise ConfigError(f"--batch-size must be a positive number of sequences, got {args.batch_size}.")
    if args.output is not None:
        check_output(args.output)  # before the load and the scoring: a refused path costs nothing
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
    print(text, flush=True)  # first: the figures are not lost if --output cannot be written
    if args.output is not None:
        check_output(args.output)  # again: the scoring took a while, and the path may have been taken meanwhile
        atomic_write_text(args.output, text + "\n")
    return 0


def is_results_text(data: bytes) -> bool:
    """Whether ``data`` is what titan-eval writes: one JSON object of ``eval/<task>/<figure>`` numbers."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return (isinstance(value, dict) and bool(value)
            and all(isinstance(k, str) and k.startswith("eval/") and isinstance(v, (int, float))
                    and not isinstance(v, bool) for k, v in value.items()))


def _is_checkpoints_folder(folder: Path) -> bool:
    """A run folder's ``checkpoints/`` (its run config.toml beside it), which training fills and prunes."""
    return folder.name == "checkpoints" and (folder.parent / "config.toml").is_file()


def check_output(path: Path) -> None:
    """ConfigError unless ``--output`` may be written: a new file, an empty one, or an earlier titan-eval result
    (re-running an evaluation to the same path replaces it). Any other file (a run's config.toml, a checkpoint's
    index) was replaced by JSON without a word, and the run it belonged to could no longer be read; a new file
    inside a titan checkpoint or a Hugging Face folder would sit among the weights that tools read and copy."""
    where = f"--output {path}"
    advice = "give a new file, e.g. --output eval.json beside the run folder"
    if path.is_dir():
        raise ConfigError(f"{where} is a folder; the figures go to a file: {advice}.")
    for folder in (path.parent.resolve(), *path.parent.resolve().parents):
        what = ("a titan checkpoint" if is_titan_checkpoint(folder) else "a Hugging Face folder" if is_hf_folder(folder)
                else "a run's checkpoints folder" if _is_checkpoints_folder(folder) else None)
        if what is not None:
            raise ConfigError(f"{where} is inside {folder}, {what}: results written there would sit among the "
                              f"weights that training and the tools read; {advice}.")
    if not path.parent.is_dir():
        raise ConfigError(f"{where}: the folder {path.parent} does not exist; create it first, or {advice}.")
    if not path.exists():
        return
    if not path.is_file():
        raise ConfigError(f"{where} is not a regular file; {advice}.")
    size = path.stat().st_size
    if size == 0:
        return  # an empty file (mktemp's) holds nothing to lose
    try:
        ours = size <= RESULTS_MAX_BYTES and is_results_text(path.read_bytes())
    except OSError as exc:  # unreadable: it cannot be told apart from a file of someone else's
        raise ConfigError(f"{where} exists and cannot be read ({exc.strerror or exc}); {advice}.") from None
    if not ours:
        raise ConfigError(f"{where} already exists and is not a titan-eval results file (a JSON object of "
                          f"eval/... figures); it is left as it is. {advice[0].upper()}{advice[1:]}, or remove "
                          f"that file first if it is yours to lose.")


def main(argv: Sequence[str] | None = None) -> int:
    return parse_and_run(PROG, build_parser(), run_eval, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
