"""``.jsonl`` files (and ``.json`` files holding a list of objects) read directly, without ``datasets``.

A ``datasets.load_dataset`` per file costs a builder, a cache folder and an Arrow
conversion: a folder of thousands of small ``.jsonl`` files took minutes, in silence.
Reading the lines here is as fast as reading the bytes, and every problem names the file
and the line: invalid UTF-8, a line that is not JSON, a line that is not an object.

Semantics match what ``datasets`` gave: blank lines are skipped; the fields of a file are the
union of its rows' keys; a row without the text field, or with a null or empty text, is
skipped; a file none of whose rows has the field is an error listing the fields it has.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["read_json_list", "read_jsonl"]


def _fields_error(path: Path, text_field: str, fields: dict[str, None]) -> ConfigError:
    return ConfigError(
        f'data file {path} has no field "{text_field}" (its fields: {", ".join(fields) or "none"}); '
        "set --data.text_field to the field that holds the text."
    )


def _text_of(path: Path, where: str, row: dict[str, Any], text_field: str, line: int | None = None) -> str | None:
    value = row.get(text_field)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f'data file {path}: {where} field "{text_field}" holds {type(value).__name__}, not text'
            f'{f" (line {line})" if line is not None else ""}; '
            "set --data.text_field to a string field, or fix that line."
        )
    return value


def read_jsonl(path: Path, *, text_field: str) -> list[str]:
    """The texts of a JSON-lines file, in order; ConfigError naming the file and line for anything amiss."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"data file {path} cannot be read ({exc.strerror or exc}); fix its permissions or "
                          f"remove it from data.source.") from None
    docs: list[str] = []
    fields: dict[str, None] = {}
    row_index = -1  # rows counted as datasets counts them (blank lines are not rows)
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"data file {path} line {number}: invalid UTF-8 (undecodable byte 0x{line[e.start]:02x} at column "
                f"{e.start + 1}); JSON text must be UTF-8. Re-encode the file as UTF-8 (e.g. iconv -f latin1 -t "
                f"utf-8), or remove that line."
            ) from None
        try:
            row = json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep for the parser
            raise ConfigError(
                f"data file {path} could not be read as JSON: line {number} is not valid JSON ({str(e)[:120]}); "
                f"each line of a .jsonl file "
                f"is one JSON object, e.g. {{\"{text_field}\": \"...\"}}. Fix or remove that line."
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"data file {path} could not be read as JSON rows: line {number} holds a JSON "
                f"{type(row).__name__}, not an object; each line of a "
                f".jsonl file is one JSON object, e.g. {{\"{text_field}\": \"...\"}}."
            )
        row_index += 1
        fields.update(dict.fromkeys(row))
        value = _text_of(path, f"row {row_index}", row, text_field, line=number)
        if value is not None:
            docs.append(value)
    if fields and text_field not in fields:
        raise _fields_error(path, text_field, fields)
    return docs


def read_json_list(path: Path, *, text_field: str) -> list[str] | None:
    """The texts of a ``.json`` file holding a list of objects; None when it holds anything else
    (JSON lines in a .json file, one object, ...: those go through ``datasets`` as before)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None
    except RecursionError:
        raise ConfigError(f"data file {path} could not be read as JSON: it is nested too deeply to parse; fix the "
                          "file or remove it from data.source.") from None
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        return None
    fields: dict[str, None] = {}
    docs: list[str] = []
    for i, row in enumerate(data):
        fields.update(dict.fromkeys(row))
        value = _text_of(path, f"row {i}", row, text_field)
        if value is not None:
            docs.append(value)
    if fields and text_field not in fields:
        raise _fields_error(path, text_field, fields)
    return docs
