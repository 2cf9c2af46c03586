"""Pre-tokenized shard sets (``tokens:DIR``): the on-disk format, its checks, and split views (the
format's names, shared with its writer ``data/prepare/``, are in ``shard_format.py``).

A shard set is a folder written by ``titan-data prepare``:

* ``shard-00000.bin``, ``shard-00001.bin``, ...: the packed token stream (every
  document as ``[BOS] tokens [EOS]``, in source order, exactly as the text path
  packs it), cut into fixed-size pieces of ``shard_tokens`` tokens (the last one
  shorter), little-endian ``uint16`` when the vocabulary fits, else ``uint32``;
* ``documents.bin``: ``num_documents + 1`` little-endian int64 offsets, the start of
  every document in the stream and the stream's length (the document boundaries);
* ``index.json``: the format version, dtype, tokenizer fingerprint, token and
  document counts, each shard's size, SHA-256 and mtime, and each source file's
  size and SHA-256.

Reading never loads the stream: only the windows a rank asks for are read (``os.pread``
on a shard kept open), so start-up time and resident memory do not grow with the
corpus. Shards are read, not memory-mapped: a mapped file truncated (or replaced by a
shorter one) while the run reads it kills the process with SIGBUS, where a read comes
back short and becomes an error naming the shard (the cost, one system call per window
piece, is measured by ``benchmarks/shard_reads.py``). Start-up reads the index, stats every file, and
re-hashes only a file whose size or mtime differs from the index (an edited or
copied shard); a size that does not match is a truncated shard.

The validation split is the text path's: document ``i`` is held out when
``floor((i + 1) * f) > floor(i * f)``. A split is kept as a short list of
segments of the global stream (the gaps between held-out documents for train, the
held-out documents for validation), computed once by reading ``documents.bin`` in
chunks.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..plugin.spec_factories import Tokenizer
from ..runtime.os_errors import not_a_folder, special_kind
from ..runtime.regular_files import read_regular
from .shard_format import DOCUMENTS_NAME, FORMAT, INDEX_NAME, VERIFIED_NAME, VERSION, file_sha256, tokenizer_fingerprint

TOKENS_PREFIX = "tokens:"
MAX_INDEX_BYTES = 64 * 1024 * 1024
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}$")
_CHUNK = 1 << 16  # document offsets read per chunk when a split is computed (bounded temporaries)


@dataclass(frozen=True)
class ShardInfo:
    path: Path
    tokens: int
    identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) when the set was checked: a replaced file differs


# Shards held open at once (least recently read closed first): far below the usual limit of 1024 descriptors.
MAX_OPEN_SHARDS = 64


class ShardSet:
    """A checked shard set: its shards memory-mapped lazily, its index values."""

    def __init__(self, folder: Path, index: dict[str, Any], shards: list[ShardInfo], vocab_size: int) -> None:
        self.folder = folder
        self.vocab_size = vocab_size  # the tokenizer's: an id at or above it is a damaged shard
        self.index = index
        self.shards = shards
        self.dtype = np.dtype(index["dtype"]).newbyteorder("<")
        self.num_tokens = int(index["num_tokens"])
        self.num_documents = int(index["num_documents"])
        self.starts = np.cumsum([0] + [s.tokens for s in shards], dtype=np.int64)
        self._open: OrderedDict[int, int] = OrderedDict()  # shard -> its open descriptor

    @property
    def documents_path(self) -> Path:
        return self.folder / DOCUMENTS_NAME

    def _changed(self, i: int, problem: str) -> ConfigError:
        return _refuse(self.folder, f"{self.shards[i].path.name} {problem} while this run read it",
                       "restore the file (or prepare the corpus into a new folder) and resume from the last checkpoint")

    def _fd(self, i: int) -> int:
        fd = self._open.get(i)
        if fd is not None:
            self._open.move_to_end(i)
            return fd
        info = self.shards[i]
        try:
            fd = os.open(info.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise self._changed(i, f"could not be opened again ({e.strerror or e})") from None
        st = os.fstat(fd)
        if info.identity != (0, 0) and (st.st_dev, st.st_ino) != info.identity:
            os.close(fd)
            raise self._changed(i, "was replaced by another file")
        self._open[i] = fd
        if len(self._open) > MAX_OPEN_SHARDS:
            os.close(self._open.popitem(last=False)[1])
        return fd

    def read(self, start: int, length: int, out: np.ndarray) -> None:
        """Copy stream tokens ``[start, start + length)`` into ``out`` (int64, at least ``length`` long)."""
        pos, filled = start, 0
        while filled < length:
            i = int(np.searchsorted(self.starts, pos, side="right")) - 1
            lo = pos - int(self.starts[i])
            take = min(length - filled, self.shards[i].tokens - lo)
            raw = bytearray(take * self.dtype.itemsize)
            fd = self._fd(i)
            try:
                got = os.preadv(fd, [raw], lo * self.dtype.itemsize)
            except OSError as e:
                raise self._changed(i, f"could not be read ({e.strerror or e})") from None
            if got != len(raw):  # the file is shorter than the index says: truncated under the run
                raise self._changed(i, f"was truncated to {os.fstat(fd).st_size} bytes (the index records "
                                       f"{self.shards[i].tokens * self.dtype.itemsize})")
            out[filled : filled + take] = np.frombuffer(raw, dtype=self.dtype)
            filled += take
            pos += take

    def close(self) -> None:
        """Close the shards held open (a later read opens them again)."""
        while self._open:
            os.close(self._open.popitem()[1])

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    def document_offsets(self, first: int, count: int) -> np.ndarray:
        """``count`` int64 entries of ``documents.bin`` from entry ``first`` (read, not mapped)."""
        with self.documents_path.open("rb") as f:
            f.seek(first * 8)
            data = np.frombuffer(f.read(count * 8), dtype="<i8")
        return data.astype(np.int64)


def _refuse(folder: Path, problem: str, fix: str = "run titan-data prepare again into a new folder") -> ConfigError:
    return ConfigError(f"shard set {folder}: {problem}; {fix}.")


def _checked_file(folder: Path, name: object, what: str) -> Path:
    """A file the index names, refused unless it is a plain name inside ``folder`` (no path, no link out)."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name):
        raise _refuse(folder, f"the index names {what} {name!r}, which is not a plain file name inside the folder",
                      "the index was edited or is not from titan-data; prepare the corpus again")
    path = folder / name
    try:
        inside = path.resolve().parent == folder.resolve()
    except OSError:
        inside = False
    if not inside:
        raise _refuse(folder, f"{what} {name} points outside the folder (a link)",
                      "replace the link with the file itself, or prepare the corpus again")
    return path


def _check_file(folder: Path, path: Path, entry: dict[str, Any], size: int, mtimes: dict[str, Any]) -> tuple[int, int]:
    """Size always; the SHA-256 when the mtime differs from the one prepare recorded (an edit or a copy).

    The mtimes live in ``.verified.json``, not in the index, so the index stays byte-identical
    between two prepares of the same inputs."""
    try:
        st = path.stat()
    except OSError as e:
        raise _refuse(folder, f"{path.name} cannot be read ({e.strerror or e})",
                      "restore the file, or prepare the corpus again") from None
    if not stat.S_ISREG(st.st_mode):  # a pipe would block the hash forever, a folder cannot be mapped
        raise _refuse(folder, f"{path.name} is not a regular file", "restore the file, or prepare the corpus again")
    if st.st_size != size:
        raise _refuse(folder, f"{path.name} has {st.st_size} bytes but the index records {size} (a truncated or "
                      "replaced file)", "restore the file, or prepare the corpus again")
    if st.st_mtime_ns != mtimes.get(path.name) and file_sha256(path) != entry.get("sha256"):
        raise _refuse(folder, f"{path.name} was modified after it was written (its SHA-256 differs from the index)",
                      "restore the file, or prepare the corpus again")
    return st.st_dev, st.st_ino


def _int(folder: Path, value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse(folder, f"the index's {what} is {value!r}, not a count",
                      "the index was edited or is not from titan-data; prepare the corpus again")
    return value


def _verified_mtimes(folder: Path) -> dict[str, Any]:
    try:
        cache = json.loads(read_regular(folder / VERIFIED_NAME))  # a FIFO here once hung the run for good
    except (OSError, ValueError, RecursionError):
        return {}  # no cache: every file is hashed (slower start-up, same checks)
    return cache if isinstance(cache, dict) else {}


def read_index(folder: Path) -> dict[str, Any]:
    path = folder / INDEX_NAME
    if os.path.lexists(path) and not path.is_file():
        raise _refuse(folder, f"index.json is {special_kind(path)}, not a regular file",
                      "put back the index.json titan-data prepare wrote")
    if not path.is_file():
        partial = (folder / "prepare.json").exists()
        raise _refuse(folder, "has no index.json" + (" (titan-data prepare did not finish)" if partial else ""),
                      "run the same titan-data prepare command again to finish it" if partial else
                      "point tokens: at a folder written by titan-data prepare")
    if path.stat().st_size > MAX_INDEX_BYTES:
        raise _refuse(folder, "index.json is too large to be an index")
    try:
        index = json.loads(read_regular(path).decode("utf-8"))
    except OSError as e:
        raise _refuse(folder, f"index.json cannot be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: nesting too deep to parse
        raise _refuse(folder, f"index.json is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _refuse(folder, "index.json is not a titan-data index")
    if index.get("version") != VERSION:
        raise _refuse(folder, f"index.json has format version {index.get('version')!r}; this titan-core reads version {VERSION}")
    if index.get("dtype") not in ("uint16", "uint32"):
        raise _refuse(folder, f"index.json names dtype {index.get('dtype')!r}, not uint16 or uint32")
    return index


def open_shard_set(folder_text: str, tokenizer: Tokenizer) -> ShardSet:
    """Open ``tokens:DIR``'s folder, check every file it names and the tokenizer; ConfigError otherwise."""
    if not folder_text.strip():
        raise ConfigError(f'data source "{TOKENS_PREFIX}" names no folder; give the --out folder of titan-data prepare '
                          f'("{TOKENS_PREFIX}DIR").')
    folder = Path(folder_text).expanduser()
    if not folder.is_dir():
        raise ConfigError(f'data source "{TOKENS_PREFIX}{folder_text}": {folder} {not_a_folder(folder)}; give the '
                          "--out folder of titan-data prepare.")
    index = read_index(folder)
    tok = index.get("tokenizer")
    want = tokenizer_fingerprint(tokenizer)
    if not isinstance(tok, dict) or tok.get("fingerprint") != want:
        got = tok.get("fingerprint") if isinstance(tok, dict) else None
        name = tok.get("name") if isinstance(tok, dict) else None
        raise _refuse(folder, f"it was built with tokenizer {name!r} (fingerprint {got}), but this run's tokenizer "
                      f"{getattr(tokenizer, 'name', type(tokenizer).__name__)!r} has fingerprint {want}",
                      "set data.tokenizer to the tokenizer the shards were prepared with, or prepare them again "
                      "with this one (titan-data prepare --tokenizer ...)")
    itemsize = 2 if index["dtype"] == "uint16" else 4
    if itemsize == 2 and tokenizer.vocab_size > 1 << 16:
        raise _refuse(folder, "it stores uint16 tokens but the tokenizer has more than 65536 ids")
    mtimes = _verified_mtimes(folder)
    entries = index.get("shards")
    if not isinstance(entries, list) or not entries:
        raise _refuse(folder, "index.json lists no shards")
    shards: list[ShardInfo] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise _refuse(folder, "index.json has a shard entry that is not an object")
        path = _checked_file(folder, entry.get("file"), "shard")
        tokens = _int(folder, entry.get("tokens"), f"token count of {path.name}")
        identity = _check_file(folder, path, entry, tokens * itemsize, mtimes)
        shards.append(ShardInfo(path, tokens, identity))
    num_tokens = _int(folder, index.get("num_tokens"), "num_tokens")
    if sum(s.tokens for s in shards) != num_tokens:
        raise _refuse(folder, "the shards' token counts do not add up to num_tokens")
    docs = index.get("documents")
    num_docs = _int(folder, index.get("num_documents"), "num_documents")
    if not isinstance(docs, dict):
        raise _refuse(folder, "index.json has no documents entry")
    docs_path = _checked_file(folder, docs.get("file"), "document file")
    if docs_path.name != DOCUMENTS_NAME:
        raise _refuse(folder, f"the document file must be {DOCUMENTS_NAME}")
    _check_file(folder, docs_path, docs, (num_docs + 1) * 8, mtimes)
    shard_set = ShardSet(folder, index, shards, int(tokenizer.vocab_size))
    if int(shard_set.document_offsets(0, 1)[0]) != 0 or int(shard_set.document_offsets(num_docs, 1)[0]) != num_tokens:
        raise _refuse(folder, "documents.bin does not start at 0 and end at num_tokens")
    return shard_set


class SplitWindows:
    """One split of a shard set as a stream of its own, cut into windows of ``window`` tokens.

    The split is a list of segments of the global stream; ``cum[k]`` is where segment
    ``k`` starts in the split's own coordinates.
    """

    def __init__(self, shard_set: ShardSet, seg_start: np.ndarray, seg_len: np.ndarray, num_docs: int) -> None:
        self.shard_set = shard_set
        self.seg_start = seg_start
        self.seg_len = seg_len
        self.cum = np.concatenate([[0], np.cumsum(seg_len)]).astype(np.int64)
        self.num_tokens = int(self.cum[-1])
        self.num_docs = num_docs

    def numel(self) -> int:
        return self.num_tokens

    def read_windows(self, rows: torch.Tensor, window: int) -> torch.Tensor:
        """Windows ``rows`` (split coordinates) as an int64 ``[len(rows), window]`` tensor; only they are read."""
        out = np.empty((len(rows), window), dtype=np.int64)
        for r, row in enumerate(rows.tolist()):
            pos, filled = int(row) * window, 0
            while filled < window:
                k = int(np.searchsorted(self.cum, pos, side="right")) - 1
                lo = pos - int(self.cum[k])
                take = min(window - filled, int(self.seg_len[k]) - lo)
                self.shard_set.read(int(self.seg_start[k]) + lo, take, out[r, filled : filled + take])
                filled += take
                pos += take
        if out.size and int(out.max()) >= self.shard_set.vocab_size:  # the index's hashes match, the ids do not
            raise _refuse(self.shard_set.folder, f"it holds token id {int(out.max())}, outside the tokenizer's "
                          f"vocabulary of {self.shard_set.vocab_size} ids (its shards were edited or written by "
                          "another program)")
        return torch.from_numpy(out)


def split_windows(shard_set: ShardSet, *, split: str, val_fraction: float) -> SplitWindows:
    """The train or validation split of ``shard_set`` (document rule of the text path)."""
    n = shard_set.num_documents
    val_starts: list[np.ndarray] = []
    val_ends: list[np.ndarray] = []
    if val_fraction > 0:
        for first in range(0, n, _CHUNK):
            count = min(_CHUNK, n - first)
            i = np.arange(first, first + count, dtype=np.float64)
            # The same float64 products as math.floor((i + 1) * f) in is_validation_doc.
            held = np.nonzero(np.floor((i + 1) * val_fraction) > np.floor(i * val_fraction))[0]
            # Every chunk is read and checked (its hash may match an index that was edited along with it):
            # offsets that go backwards or past the stream would make segments of negative length.
            offsets = shard_set.document_offsets(first, count + 1)
            if offsets.size != count + 1 or bool(np.any(np.diff(offsets) < 0)) or int(offsets[-1]) > shard_set.num_tokens:
                raise _refuse(shard_set.folder, f"documents.bin's offsets {first}..{first + count} are not "
                              "increasing within the stream (the file was edited or is not from titan-data)")
            if held.size:
                val_starts.append(offsets[held])
                val_ends.append(offsets[held + 1])
    starts = np.concatenate(val_starts) if val_starts else np.zeros(0, dtype=np.int64)
    ends = np.concatenate(val_ends) if val_ends else np.zeros(0, dtype=np.int64)
    if split == "validation":
        return SplitWindows(shard_set, starts, ends - starts, num_docs=int(starts.size))
    gap_start = np.concatenate([[0], ends]).astype(np.int64)
    gap_end = np.concatenate([starts, [shard_set.num_tokens]]).astype(np.int64)
    keep = gap_end > gap_start
    return SplitWindows(shard_set, gap_start[keep], (gap_end - gap_start)[keep], num_docs=n - int(starts.size))

