"""What ``titan-data prepare`` packed, told truthfully in its index.

* **Duplicates**: a file that is a link to (or a hard link of) a file already listed, or byte-identical
  to one, is the same document again. It is skipped and named (``--keep-duplicates`` packs it anyway,
  for a deliberate upsampling); the index records it with ``duplicate_of``. Only files of equal size
  are hashed for this, before packing.
* **Inputs that change while prepare runs**: every file is listed once, and that list is both what is
  hashed and what is packed (a file added to a source folder meanwhile is not packed, and prepare says
  so). The index must not be written unless the hash it records describes the bytes that were packed:

  - each file's SHA-256 is taken before anything reads it (``SourceHashes``: a thread hashes the files in
    order, and the planner waits for a file's hash before it reads the file or hands out a task of it;
    hashing is far faster than tokenizing, so it stays ahead, concurrent with the packing of earlier files);
  - each file is hashed again as soon as nothing will read it any more (``ReadOrder``: the planner has moved
    past it and every task of it is packed), in a second thread, again while later files are packed;
  - before ``index.json`` is written, each file's size and modification time are compared with those
    taken when it was listed (the cheap test), then its two hashes. Any difference (an edit, even one that
    keeps the size and restores the modification time, as ``cp -p``, ``rsync -t`` or ``touch -r`` do) or a
    removal is refused, naming the file; no index is written, the full shards already written are kept.

  Not caught: an edit made and undone entirely between the first hash and the second (the bytes are the
  same at both ends of the read window, whatever was read in between). A file whose bytes changed and came
  back to equal the hash was not changed in any way a hash could show.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from ...errors import ConfigError
from ..shard_format import HashStopped, file_sha256
from ..sources import source_files


# A NamedTuple, not a dataclass: defined in ~0.15 ms at import against ~1 ms, and prepare's start-up counts.
class Duplicate(NamedTuple):
    path: Path
    of: Path
    how: str  # "a link to", "the file linked to by", "the same file as", "a hard link of", "byte-identical to"
    # Its input number (``tasks.plan_tasks``: the sources' files and builtin/hf: sources, counted in order). The
    # same file listed twice is two equal paths: only the number tells the repeat from the first, which is read.
    number: int = -1

    def line(self) -> str:
        if self.path == self.of:  # listed twice (as a.jsonl and ./a.jsonl, or as a folder and a file in it)
            return (f"prepare: skipped {self.path}: listed more than once, read only where it first comes "
                    "(--keep-duplicates packs it again)")
        return f"prepare: skipped {self.path}: {self.how} {self.of}, already read (--keep-duplicates packs it again)"


def _flat(files: list[list[Path] | None]) -> list[Path]:
    return [p for paths in files if paths is not None for p in paths]


def _numbered(files: list[list[Path] | None]) -> list[tuple[int, Path]]:
    """Every listed file with its input number, counted as ``tasks.plan_tasks`` counts (builtin and hf: take one)."""
    numbered: list[tuple[int, Path]] = []
    number = 0
    for paths in files:
        if paths is None:
            number += 1
            continue
        for path in paths:
            numbered.append((number, path))
            number += 1
    return numbered


def find_duplicates(files: list[list[Path] | None], hashes: dict[Path, str]) -> list[Duplicate]:
    """Each file that repeats one listed before it (in source order), with its input number: the first time a file
    comes it is read, every later time it is a repeat. ``hashes`` collects the SHA-256 of the files hashed here
    (those sharing a size), so they are not read twice."""
    found: list[Duplicate] = []
    first_by_inode: dict[tuple[int, int], Path] = {}
    # Each size's first file, hashed only once a second file of its size comes (None once hashed); the first
    # file of each content by its hash. One hash and two dict lookups per file: linear in the file count.
    unhashed_by_size: dict[int, Path | None] = {}
    first_by_hash: dict[str, Path] = {}
    for number, path in _numbered(files):
        st = path.stat()
        same = first_by_inode.get((st.st_dev, st.st_ino))
        if same is not None:
            if path.is_symlink():
                how = "a link to"
            elif same.is_symlink():
                how = "the file linked to by"
            else:
                how = "the same file as" if same.resolve() == path.resolve() else "a hard link of"
            found.append(Duplicate(path, same, how, number))
            continue
        first_by_inode[(st.st_dev, st.st_ino)] = path
        if st.st_size not in unhashed_by_size:  # the first of its size: nothing to compare it with yet
            unhashed_by_size[st.st_size] = path
            continue
        first = unhashed_by_size[st.st_size]
        if first is not None:
            first_by_hash.setdefault(_hash(first, hashes), first)
            unhashed_by_size[st.st_size] = None
        twin = first_by_hash.setdefault(_hash(path, hashes), path)
        if twin is not path:
            found.append(Duplicate(path, twin, "byte-identical to", number))
    return found


def _hash(path: Path, hashes: dict[Path, str]) -> str:
    if path not in hashes:
        hashes[path] = file_sha256(path)
    return hashes[path]


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
        raise _changed(path, "was removed" if now is None else (
            f"changed (size {size} -> {now[0]} bytes)" if now[0] != size else "changed (its modification time moved)"),
            out)


def _changed(path: Path, what: str, out: Path) -> ConfigError:
    return ConfigError(
        f"{path} {what} while prepare read it, so the shards may hold its old text, its new text or parts of both; "
        f"no index.json was written in {out} (its hash of that file could not be trusted). Prepare again once "
        "the inputs stop changing (a copy of them, or a new --out).")


class SourceHashes:
    """Every listed file's SHA-256, taken by a thread in listed order (the order the planner reads them in)
    before anything reads the file (``sha256`` waits for it), and again by a second thread once nothing will
    (``hash_again``); ``check`` says whether any differ. ``known``: hashes already taken before packing
    (``find_duplicates``); ``stop``: asked between blocks, so an early end does not wait. Two threads and a dict,
    not a future per file: a future costs about 2 KB while it waits, 2 GB for a million files."""

    def __init__(self, files: list[list[Path] | None], known: dict[Path, str], stop: Callable[[], bool]) -> None:
        self.stop = stop
        self.first: dict[Path, str | OSError] = dict(known)
        self.first_ended = False  # the first hashing finished or stopped: nothing more will come
        self.ready = threading.Condition()
        self.queued: set[Path] = set()  # hashed again (or about to be)
        self.again: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self.changed: list[tuple[Path, str]] = []  # files whose second hash differs (or failed), as found
        paths = [p for p in dict.fromkeys(_flat(files)) if p not in known]
        self.threads = [threading.Thread(target=self._hash_first, args=(paths,), name="titan-source-hash", daemon=True),
                        threading.Thread(target=self._hash_again, name="titan-source-rehash", daemon=True)]
        for thread in self.threads:
            thread.start()

    def _hash_first(self, paths: list[Path]) -> None:
        try:
            for path in paths:
                try:
                    value: str | OSError = file_sha256(path, self.stop)
                except OSError as e:  # raised where the hash is asked for (the planner, the index's description)
                    value = e
                with self.ready:
                    self.first[path] = value
                    self.ready.notify_all()
                if self.stop():
                    break
        except HashStopped:  # the run ended early (``stop``): the files not hashed yet are not needed
            return
        finally:
            with self.ready:
                self.first_ended = True
                self.ready.notify_all()

    def sha256(self, path: Path) -> str:
        """The file's hash taken before anything read it (waits for it)."""
        with self.ready:
            self.ready.wait_for(lambda: path in self.first or self.first_ended)
            value = self.first.get(path)
        if value is None:
            raise HashStopped(path)
        if isinstance(value, OSError):
            raise value
        return value

    def hash_again(self, path: Path) -> None:
        """Nothing reads ``path`` any more: its hash again, in the background."""
        self.queued.add(path)
        self.again.put(path)

    def _hash_again(self) -> None:
        while (path := self.again.get()) is not None:
            try:
                if file_sha256(path, self.stop) != self.sha256(path):
                    self.changed.append((path, "changed (its bytes differ from those hashed before it was read, though "
                                               "its size and modification time are as they were)"))
            except HashStopped:
                return
            except OSError:
                self.changed.append((path, "was removed or became unreadable"))

    def check(self, listed: dict[Path, tuple[int, int]], out: Path) -> None:
        """ConfigError naming the first file that changed since it was listed (size or modification time), then
        the first whose bytes differ from those hashed before it was read. Once packing is done."""
        check_unchanged(listed, out)
        for path in listed:
            if path not in self.queued:  # not read by this run (a duplicate skipped): compared all the same
                self.hash_again(path)
        self.again.put(None)
        self.threads[1].join()
        if self.changed:
            path, what = self.changed[0]
            raise _changed(path, what, out)

    def close(self) -> None:
        """End both threads (the caller's ``stop`` is set, so neither finishes the file it is hashing)."""
        self.again.put(None)
        for thread in self.threads:
            thread.join()


class ReadOrder:
    """Follows the planner through the inputs (``opening``) and each task from the hand-out (``handed``) to the
    shards (``packed``), so that a file is hashed again as soon as nothing will read it: the planner has moved
    past it and every task of it is packed. ``inputs``: per input number (``plan_tasks``), its file, or the
    source's name for builtin and hf:."""

    def __init__(self, hashes: SourceHashes, inputs: Sequence[Path | str]) -> None:
        self.hashes = hashes
        self.inputs = inputs
        self.current = -1  # the input the planner is in
        self.unpacked: dict[int, int] = {}  # input -> its tasks handed out and not yet packed (until it is done)
        self.input_of: dict[int, int] = {}  # task -> its input

    def opening(self, number: int) -> None:
        """The planner is about to read input ``number``: wait for its hash (taken before any read of it)."""
        path = self.inputs[number]
        if isinstance(path, Path):
            self.hashes.sha256(path)
        passed, self.current = self.current, number
        self.unpacked[number] = 0
        if self.unpacked.get(passed) == 0:
            self._done(passed)

    def handed(self, task: int) -> None:
        self.input_of[task] = self.current
        self.unpacked[self.current] += 1

    def packed(self, task: int) -> int:
        """Task ``task`` is in the shards; its input's number."""
        number = self.input_of.pop(task)
        self.unpacked[number] -= 1
        if number != self.current and self.unpacked[number] == 0:
            self._done(number)
        return number

    def all_packed(self) -> None:
        """Every task is packed: the inputs not yet hashed again are."""
        for number in list(self.unpacked):
            self._done(number)

    def _done(self, number: int) -> None:
        del self.unpacked[number]
        path = self.inputs[number]
        if isinstance(path, Path):
            self.hashes.hash_again(path)


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
