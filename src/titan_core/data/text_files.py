"""A user's file read as text in a given encoding, or refused with the caller's message.

Shared by the data sources (``.txt`` files, UTF-8) and the tiktoken reader (ASCII ranks files).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError


def read_text_as(path: Path, encoding: str, refusal: Callable[[UnicodeDecodeError], str]) -> str:
    """``path``'s bytes decoded as ``encoding``; a ConfigError of ``refusal(error)`` (without the
    decoder's traceback) when they are not."""
    raw = path.read_bytes()
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        message = refusal(e)
    raise ConfigError(message)
