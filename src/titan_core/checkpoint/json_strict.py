"""JSON objects with a key given twice are refused, not resolved silently.

Python's ``json`` keeps the last of two equal keys, so a checkpoint's index or
identity record could list ``"model.norm.weight"`` (or ``"step"``) twice and show one
value to a reviewer reading the file top-down and another to the loader. A checkpoint
titan-core wrote never repeats a key, so a repeat is a forgery or damage.
"""

from __future__ import annotations

from typing import Any

__all__ = ["unique_keys"]


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads``: a dict, or ValueError naming the repeated key."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice in one JSON object")
        out[key] = value
    return out
