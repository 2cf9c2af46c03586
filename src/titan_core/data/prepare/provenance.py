"""What ``titan-data prepare`` packed, told truthfully in its index.

* **Duplicates**: a file that is a link to (or a hard link of) a file already listed, or byte-identical
  to one, is the same document again. It is skipped and named (``--keep-duplicates`` packs it anyway,
  for a deliberate upsampling); the index records it with ``duplicate_of``. Only files of equal size
  are hashed for this, before packing.
* **Inputs that change while prepare runs**: every file is listed once, and that list is both what is
  hashed and what is packed (a file added to a source folder meanwhile is not packed, and prepare says
  so). Each file's size and modification time are taken when it is listed and compared once packing is
  done, before ``index.json`` is written: a file edited or removed in between is refused, naming it, and
  no index is written (its recorded hash could not be trusted to match the packed tokens).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from ...errors import ConfigError
from ..shard_format import file_sha256
from ..sources import source_files


# A NamedTuple, not a dataclass: defined in ~0.15 ms at import against ~1 ms, and prepare's start-up counts.
class Duplicate(NamedTuple):
    path: Path
    of: Path
    how: str  # "a link to", "the file linked to by", "the same file as", "a hard link of", "byte-identical to"

    def line(self) -> str:
        return f"prepare: skipped {self.path}: {self.how} {self.of}, already read (--keep-duplicates packs it again)"


def _flat(files: list[list[Path] | None]) -> list[Path]:
    return [p for paths in files if paths is not None for p in paths]


def find_duplicates(files: list[list[Path] | None], hashes: dict[Path, str]) -> list[Duplicate]:
    """Each file that repeats one listed before it (in source order). ``hashes`` collects the SHA-256 of the
    files hashed here (those sharing a size), so they are not read twice."""
    found: list[Duplicate] = []
    first_by_inode: dict[tuple[int, int], Path] = {}
    first_by_size: dict[int, list[Path]] = {}
    for path in _flat(files):
        st = path.stat()
        same = first_by_inode.get((st.st_dev, st.st_ino))
        if same is not None:
            if path.is_symlink():
                how = "a link to"
            elif same.is_symlink():
                how = "the file linked to by"
            else:
                how = "the same file as" if same.resolve() == path.resolve() else "a hard link of"
            found.append(Duplicate(path, same, how))
            continue
        first_by_inode[(st.st_dev, st.st_ino)] = path
        earlier = first_by_size.setdefault(st.st_size, [])
        if earlier:
            for p in (*earlier, path):
                if p not in hashes:
                    hashes[p] = file_sha256(p)
            twin = next((p for p in earlier if hashes[p] == hashes[path]), None)
            if twin is not None:
                found.append(Duplicate(path, twin, "byte-identical to"))
                continue
        earlier.append(path)
    return found


def listed_state(files: list[list[Path] | None]) -> dict[Path, tuple[int, int]]:
    """(size, modification time in ns) of every file, taken when it is listed: before anything reads it."""
    return {p: _state(p) for p in _flat(files)}


def _state(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def check_unchanged(listed: dict[Path, tuple[int, int]], out: Path) -> None:
    """ConfigError naming the first file whose size or modification time moved since it was listed."""
    for path, (size, mtime_ns) in listed.items():
        try:
            now = _state(path)
        except OSError:
            now = None
        if now == (size, mtime_ns):
            continue
        what = "was removed" if now is None else (
            f"changed (size {size} -> {now[0]} bytes)" if now[0] != size else "changed (its modification time moved)")
        raise ConfigError(
            f"{path} {what} while prepare read it, so the shards may hold its old text, its new text or parts of both; "
            f"no index.json was written in {out} (its hash of that file could not be trusted). Prepare again once "
            "the inputs stop changing (a copy of them, or a new --out).")


def added_files(sources: list[str], files: list[list[Path] | None]) -> list[Path]:
    """Files found in a source folder now that were not there when prepare listed it (they are not packed)."""
    added: list[Path] = []
    for source, paths in zip(sources, files):
        if paths is None or not Path(source).expanduser().is_dir():
            continue
        try:
            now = source_files(source)
        except ConfigError:  # the folder itself changed shape: the check of each listed file says what matters
            continue
        known = {os.fspath(p) for p in paths}
        added.extend(p for p in now if os.fspath(p) not in known)
    return added
