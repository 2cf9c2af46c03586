"""The built-in corpus: text every Python installation already has, so nothing is downloaded.

Documents, in this fixed order:

1. the help topics of ``pydoc_data.topics.topics`` (English prose about the
   language), one document per topic, sorted by topic name;
2. the top-level ``.py`` modules of the standard library
   (``sysconfig.get_paths()["stdlib"]``), one document per file, sorted by file
   name, stopping before the file that would take the total past
   :data:`MAX_BYTES`. Packages, ``site-packages`` and the machine-specific
   ``_sysconfigdata*`` modules are left out, so the same Python version gives the
   same documents on every machine (distributions that strip standard modules
   can differ).
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

# About 4 MiB of text: enough for the debug models, quick to tokenize (a second or two).
MAX_BYTES = 4 * 1024 * 1024


def _stdlib_modules() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in stdlib.glob("*.py") if p.is_file() and not p.name.startswith("_sysconfigdata")]
    return sorted(files, key=lambda p: p.name)


@functools.lru_cache(maxsize=1)
def builtin_documents() -> tuple[str, ...]:
    """The built-in corpus as a tuple of documents (cached per process)."""
    from pydoc_data.topics import topics

    docs = [topics[name] for name in sorted(topics)]
    total = sum(len(d.encode("utf-8")) for d in docs)
    for path in _stdlib_modules():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # the stdlib is UTF-8; anything else is skipped the same way everywhere
        size = len(text.encode("utf-8"))
        if total + size > MAX_BYTES:
            break
        docs.append(text)
        total += size
    return tuple(docs)
