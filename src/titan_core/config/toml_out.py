"""Write a config dict as TOML that ``--config`` reads back unchanged."""

from __future__ import annotations

import json
from typing import Any


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


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
