"""The names and rules of the shard format that both its writer (``data/prepare/``) and its reader
(``shards.py``, whose docstring describes the format) use; no torch here, so ``titan-data prepare``
starts without it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:  # its module imports torch
    from ..plugin.spec_factories import Tokenizer

FORMAT = "titan-tokens"
VERSION = 1
INDEX_NAME = "index.json"
DOCUMENTS_NAME = "documents.bin"
VERIFIED_NAME = ".verified.json"
_HASH_BLOCK = 8 << 20


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.bin"


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """The tokenizer's fingerprint (``spec_factories.Fingerprinted``, checked by attribute: that protocol's
    module imports torch); a tokenizer without one cannot be matched against shards."""
    fingerprint = getattr(tokenizer, "fingerprint", None)
    if fingerprint is not None:
        return str(fingerprint)
    raise ConfigError(
        f"the tokenizer {tokenizer!r} has no fingerprint, so shards cannot record which tokenizer wrote them; "
        "use the built-in tokenizer or a Llama-3-format tokenizer.model."
    )


class HashStopped(Exception):
    """``file_sha256`` was asked to stop (its caller is ending)."""


def file_sha256(path: Path, stop: Callable[[], bool] | None = None) -> str:
    """The file's SHA-256; ``stop`` is asked between blocks (a hash in a thread ends when its caller does)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_HASH_BLOCK):
            if stop is not None and stop():
                raise HashStopped(path)
            digest.update(block)
    return digest.hexdigest()
