"""``.jsonl`` files (and ``.json`` files holding a list of objects) read directly, without ``datasets``.

A ``datasets.load_dataset`` per file costs a builder, a cache folder and an Arrow
conversion: a folder of thousands of small ``.jsonl`` files took minutes, in silence.
Reading the lines here is as fast as reading the bytes, and every problem names the file
and the line: invalid UTF-8, a line that is not JSON, a line that is not an object.

The rules (a byte-order mark, invalid UTF-8, a row without the text field, a null or empty text) are
``text_rules.py``'s, the same ``titan-data prepare`` reads by. Blank lines are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .text_rules import decode_utf8, row_text

__all__ = ["NotJsonLines", "read_json_list", "read_jsonl"]


class NotJsonLines(ConfigError):
    """A line that is not a JSON object: the file is not JSON lines (a ``.json`` file may be another JSON form)."""


# What a file of each suffix holds (the forms titan-data prepare packs too), keyed by "is it .json".
_FORMS = {False: "each line of a .jsonl file is one JSON object",
          True: "a .json file holds one JSON list of objects, or one JSON object per line"}


def read_jsonl(path: Path, *, text_field: str) -> list[str]:
    """The texts of a JSON-lines file, in order; ConfigError naming the file and line for anything amiss."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"data file {path} cannot be read ({exc.strerror or exc}); fix its permissions or "
                          f"remove it from data.source.") from None
    docs: list[str] = []
    row_index = -1  # rows counted as datasets counts them (blank lines are not rows)
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        text = decode_utf8(line, path=path, line=number)
        try:
            row = json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep for the parser
            raise NotJsonLines(
                f"data file {path} could not be read as JSON: line {number} is not valid JSON ({str(e)[:120]}); "
                f"{_FORMS[path.suffix.lower() == '.json']}, e.g. {{\"{text_field}\": \"...\"}}. Fix or remove that line."
            ) from None
        if not isinstance(row, dict):
            raise NotJsonLines(
                f"data file {path} could not be read as JSON rows: line {number} holds a JSON "
                f"{type(row).__name__}, not an object; {_FORMS[path.suffix.lower() == '.json']}, "
                f"e.g. {{\"{text_field}\": \"...\"}}."
            )
        row_index += 1
        value = row_text(row, where=f"data file {path} line {number}", row=row_index, text_field=text_field)
        if value is not None:
            docs.append(value)
    return docs


def read_json_list(path: Path, *, text_field: str) -> list[str] | None:
    """The texts of a ``.json`` file holding a list of objects; None when it holds anything else
    (JSON lines in a .json file, or a form neither reader takes: the caller reads it as JSON lines)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        data = json.loads(decode_utf8(raw, path=path))
    except ValueError:
        return None
    except RecursionError:
        raise ConfigError(f"data file {path} could not be read as JSON: it is nested too deeply to parse; fix the "
                          "file or remove it from data.source.") from None
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        return None
    docs: list[str] = []
    for i, row in enumerate(data):
        value = row_text(row, where=f"data file {path}", row=i, text_field=text_field)
        if value is not None:
            docs.append(value)
    return docs
