"""The built-in corpus: a fixed text snapshot shipped in the wheel, so nothing is downloaded.

``assets/builtin_corpus.json.xz`` holds about 4 MiB of text (CPython 3.11.7's help
topics and top-level standard-library modules), written once by
``scripts/make_builtin_corpus.py``. Every machine reads the same documents, in the
same order, whatever Python it runs, so runs and checkpoints carry across hosts
and Python upgrades.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

SNAPSHOT_PATH = Path(__file__).resolve().parents[1] / "assets" / "builtin_corpus.json.xz"
# The snapshot's text size is at most this (the build script stops before it).
MAX_BYTES = 4 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def builtin_documents() -> tuple[str, ...]:
    """The built-in corpus as a tuple of documents (cached per process)."""
    import lzma  # start-up: only the built-in corpus is xz; ``titan-data prepare FILE`` never reads it

    try:
        data = json.loads(lzma.decompress(SNAPSHOT_PATH.read_bytes()).decode("utf-8"))
        docs = data["documents"]
        ok = data.get("format") == 1 and isinstance(docs, list) and all(isinstance(d, str) for d in docs)
    except (OSError, lzma.LZMAError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise RuntimeError(f"the built-in corpus {SNAPSHOT_PATH} cannot be read ({e}); reinstall titan-core") from e
    if not ok:
        raise RuntimeError(f"the built-in corpus {SNAPSHOT_PATH} is not a format-1 snapshot; reinstall titan-core")
    return tuple(docs)
