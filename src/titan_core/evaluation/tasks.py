"""Task files: JSON lines, one example a line, read and checked before anything is trained.

A multiple-choice line is ``{"context": str, "choices": [str, ...], "gold": int}``; a perplexity
line is ``{"text": str}``. Every line of one file is of one kind. Other fields (an ``id``, the
source's own) are allowed and ignored. A bad line stops the run at start-up with ``file:line``,
what is wrong, and how to fix it (a ConfigError: exit 2, no traceback).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from ..runtime.os_errors import describe_os_error

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "eval_tasks"
# Built-in tasks, by name: written for the built-in corpus (Python's docs and sources) and tokenizer.
BUILTIN_TASKS: dict[str, Path] = {
    "python_syntax": ASSETS / "python_syntax.jsonl",
    "python_text": ASSETS / "python_text.jsonl",
}
BUILTIN = "builtin"  # every built-in task; "builtin:NAME" one of them

Kind = Literal["multiple_choice", "perplexity"]
MC_FIELDS = ("context", "choices", "gold")


@dataclass(frozen=True)
class MultipleChoice:
    context: str
    choices: tuple[str, ...]
    gold: int
    line: int


@dataclass(frozen=True)
class Document:
    text: str
    line: int


@dataclass(frozen=True)
class Task:
    name: str
    path: Path
    kind: Kind
    examples: tuple[MultipleChoice, ...] | tuple[Document, ...]

    def limited(self, limit: int | None) -> Task:
        """The task with only its first ``limit`` examples (all of them when None)."""
        if limit is None:
            return self
        return Task(self.name, self.path, self.kind, self.examples[:limit])


def task_paths(names: list[str]) -> list[tuple[str, Path]]:
    """(task name, file) for each entry of ``eval.tasks``: a JSONL path, ``builtin`` or ``builtin:NAME``."""
    out: list[tuple[str, Path]] = []
    for entry in names:
        if entry == BUILTIN:
            out.extend(BUILTIN_TASKS.items())
        elif entry.startswith(BUILTIN + ":"):
            name = entry.split(":", 1)[1]
            if name not in BUILTIN_TASKS:
                raise ConfigError(f"eval.tasks: {entry!r} names no built-in task; the built-in tasks are "
                                  f"{', '.join(f'builtin:{n}' for n in BUILTIN_TASKS)} (or 'builtin' for all).")
            out.append((name, BUILTIN_TASKS[name]))
        else:
            path = Path(entry)
            out.append((path.stem, path))
    names_seen = [name for name, _ in out]
    repeated = sorted({n for n in names_seen if names_seen.count(n) > 1})
    if repeated:
        raise ConfigError(f"eval.tasks: two tasks are named {repeated[0]!r} (a task's name is its file name without "
                          f".jsonl, and its metrics are eval/<name>/...); rename one file or list it once.")
    return out


def load_tasks(names: list[str]) -> list[Task]:
    """Every task of ``eval.tasks``, read and checked; a ConfigError names the first bad file or line."""
    return [read_task(name, path) for name, path in task_paths(names)]


def read_task(name: str, path: Path) -> Task:
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ConfigError(f"eval task file {path} {what}; give a JSONL file of examples (docs/evaluation.md) or "
                          f"'builtin'.")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read eval task file {path}: {describe_os_error(exc)}") from None
    kind: Kind | None = None
    examples: list[MultipleChoice | Document] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        record = _json_object(line, where)
        line_kind: Kind = "multiple_choice" if any(f in record for f in MC_FIELDS) else "perplexity"
        if "text" in record and line_kind == "multiple_choice":
            raise ConfigError(f"{where}: the line has both 'text' (perplexity) and multiple-choice fields; a line is "
                              f"one or the other (docs/evaluation.md).")
        if kind is not None and line_kind != kind:
            raise ConfigError(f"{where}: a {line_kind.replace('_', '-')} line in a {kind.replace('_', '-')} task; "
                              f"put each kind of task in its own file.")
        kind = line_kind
        examples.append(_multiple_choice(record, where, number) if kind == "multiple_choice"
                        else _document(record, where, number))
    if kind is None:
        raise ConfigError(f"eval task file {path} holds no example; add one JSON object per line (docs/evaluation.md).")
    return Task(name, path, kind, tuple(examples))  # type: ignore[arg-type]


def _json_object(line: bytes, where: str) -> dict[str, object]:
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text; save the task file as UTF-8.") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{where}: not JSON ({exc}); each line must be one JSON object, e.g. "
                          '{"context": "2 + 2 =", "choices": [" 4", " 5"], "gold": 0}.') from None
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: a JSON {type(record).__name__}, not an object; each line must be one JSON object "
                          f"with context/choices/gold or text.")
    if not any(f in record for f in (*MC_FIELDS, "text")):
        raise ConfigError(f"{where}: no 'context', 'choices', 'gold' or 'text' field (it has {sorted(record)}); a "
                          f"multiple-choice line needs context, choices and gold, a perplexity line needs text.")
    return record


def _multiple_choice(record: dict[str, object], where: str, number: int) -> MultipleChoice:
    missing = [f for f in MC_FIELDS if f not in record]
    if missing:
        raise ConfigError(f"{where}: missing field {missing[0]!r}; a multiple-choice line needs 'context' (a string), "
                          f"'choices' (a list of strings) and 'gold' (the index of the right choice).")
    context, choices, gold = record["context"], record["choices"], record["gold"]
    if not isinstance(context, str):
        raise ConfigError(f"{where}: 'context' is a {type(context).__name__}; give the text before the choices as a "
                          f"string (it may be empty).")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise ConfigError(f"{where}: 'choices' must be a list of strings, e.g. [\" 4\", \" 5\"].")
    if len(choices) < 2:
        raise ConfigError(f"{where}: 'choices' has {len(choices)} entr{'y' if len(choices) == 1 else 'ies'}; give at "
                          f"least two continuations to choose between.")
    empty = [i for i, c in enumerate(choices) if not c]
    if empty:
        raise ConfigError(f"{where}: choice {empty[0]} is the empty string, which has no tokens to score; give each "
                          f"choice some text (usually starting with a space).")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ConfigError(f"{where}: 'gold' is {json.dumps(gold)}, but it must be the index of the right choice, a "
                          f"whole number from 0 to {len(choices) - 1}.")
    return MultipleChoice(context, tuple(choices), gold, number)


def _document(record: dict[str, object], where: str, number: int) -> Document:
    text = record["text"]
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{where}: 'text' must be a non-empty string (the document whose perplexity is measured).")
    return Document(text, number)
