"""Write a config dict as TOML that ``--config`` reads back unchanged."""

from __future__ import annotations

import json
from typing import Any


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an item of a list of tables (optimizer.param_groups): an inline table
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _string(v: str) -> str:
    """A TOML basic string. A JSON string is one, except for the bytes of a file name that is not
    UTF-8 (Python holds them as lone surrogates U+DC80..U+DCFF, and a \\udcXX escape is not TOML):
    those stay raw, so the file written with surrogateescape holds the name's own bytes and
    ``--config`` reads back the same path (config/sources.py)."""
    if not any("\udc80" <= c <= "\udcff" for c in v):
        return json.dumps(v)
    parts: list[str] = []
    plain: list[str] = []
    for c in v:
        if "\udc80" <= c <= "\udcff":
            parts.append(json.dumps("".join(plain))[1:-1])
            parts.append(c)
            plain = []
        else:
            plain.append(c)
    parts.append(json.dumps("".join(plain))[1:-1])
    return '"' + "".join(parts) + '"'


def _table(name: str, data: dict[str, Any], out: list[str]) -> None:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    out.append(f"[{name}]")
    # TOML has no null: a None field is left out, which restores its default (None) on reading.
    out.extend(f"{k} = {_value(v)}" for k, v in scalars.items() if v is not None)
    out.append("")
    for key, sub in tables.items():
        _table(f"{name}.{key}", sub, out)


def dumps(config: dict[str, dict[str, Any]]) -> str:
    """TOML text for a two-level (section -> fields) config dict; nested dicts become dotted tables."""
    out: list[str] = []
    for section, data in config.items():
        _table(section, data, out)
    return "\n".join(out).rstrip() + "\n"
