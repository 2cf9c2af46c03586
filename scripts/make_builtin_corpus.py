"""Build src/titan_core/assets/builtin_corpus.json.xz, the built-in corpus snapshot.

The snapshot is text taken once from CPython 3.11.7's own files and shipped in the
titan-core wheel, so every machine trains on the same tokens whatever Python it
runs (reading the running interpreter's files instead gave 38,163 windows on
3.11.2 and 37,264 on 3.11.7). Documents, in this fixed order:

1. the help topics of ``pydoc_data.topics.topics`` (English prose about the
   language), one document per topic, sorted by topic name;
2. the top-level ``.py`` modules of the standard library, one document per file,
   sorted by file name, stopping before the file that would take the total past
   MAX_BYTES. Packages, ``site-packages`` and the machine-specific
   ``_sysconfigdata*`` modules are left out.

Run it with exactly that Python (the script refuses any other version): the
output is then byte-identical on every machine.

Usage: python3.11 scripts/make_builtin_corpus.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import lzma
import platform
import sys
import sysconfig
from pathlib import Path

SOURCE_PYTHON = "3.11.7"
# About 4 MiB of text: enough for the debug models, quick to tokenize (a second or two).
MAX_BYTES = 4 * 1024 * 1024
# The wheel must stay small: the compressed snapshot may not exceed this.
MAX_COMPRESSED_BYTES = 5 * 1024 * 1024
OUT = Path(__file__).resolve().parents[1] / "src" / "titan_core" / "assets" / "builtin_corpus.json.xz"


def stdlib_documents() -> list[str]:
    from pydoc_data.topics import topics

    docs = [topics[name] for name in sorted(topics)]
    total = sum(len(d.encode("utf-8")) for d in docs)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in stdlib.glob("*.py") if p.is_file() and not p.name.startswith("_sysconfigdata")),
                   key=lambda p: p.name)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        size = len(text.encode("utf-8"))
        if total + size > MAX_BYTES:
            break
        docs.append(text)
        total += size
    return docs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if platform.python_version() != SOURCE_PYTHON:
        print(f"error: the snapshot is built from Python {SOURCE_PYTHON}; this is {platform.python_version()} "
              f"({sys.executable}). Run it with Python {SOURCE_PYTHON}.", file=sys.stderr)
        return 2
    docs = stdlib_documents()
    payload = json.dumps({"format": 1, "python": SOURCE_PYTHON, "documents": docs}, ensure_ascii=False)
    # Fixed preset and no timestamp in the .xz container: the same input gives the same bytes.
    data = lzma.compress(payload.encode("utf-8"), format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)
    if len(data) > MAX_COMPRESSED_BYTES:
        print(f"error: compressed snapshot is {len(data):,} bytes, over {MAX_COMPRESSED_BYTES:,}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"wrote {args.out}: {len(docs)} documents, {len(payload.encode()):,} bytes of JSON, {len(data):,} compressed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
