"""The parent's side of ``titan-data prepare``: it appends the workers' pieces, in task order, to
fixed-size shard files (format in ``data/shards.py``) and records after every shard how far it got.

A piece is read from the page cache and written once into the shard being filled; its SHA-256
grows as it is written. One background thread does everything that waits on the disk, so the
disk's pace does not stop the parent, and with it the workers: every ``SYNC_BYTES`` written it
flushes the shard so far to disk (a shard's fsync at its end would otherwise wait for all of it,
most of a second for a 128 MB shard, and the last one's wait would be added to the whole run);
a full shard is then made durable (fsync, rename to its final name, its documents' offsets and records
(``repeats.RECORD``: what a resumed prepare needs to count repeated documents), then ``prepare.json``)
while the next one fills. Once the last shard is written the repeats are counted, for the index.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import numpy as np

from ...errors import ConfigError
from ..shard_format import DOCUMENTS_NAME, FORMAT, INDEX_NAME, VERIFIED_NAME, VERSION, shard_name
from .repeats import RECORD, Repeats, find_repeats
from .tasks import TASK_BYTES

PROGRESS_NAME = "prepare.json"
RECORDS_SUFFIX = ".digests"  # beside a shard until the index is written: its documents' records (repeats.py)
SYNC_BYTES = 16 << 20  # a shard's bytes written between two background flushes to disk


def write_atomic(path: Path, data: bytes | memoryview, *, sync: bool = True) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def publish(f: IO[bytes], tmp: Path, path: Path) -> None:
    """A shard written to ``tmp`` through ``f``: on disk, closed, under its final name."""
    try:
        f.flush()
        os.fsync(f.fileno())
    finally:
        f.close()
    os.replace(tmp, path)


def json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


class ShardWriter:
    """Packs pieces of documents into fixed-size shards; records progress after every shard.

    ``inputs`` is called when the first record is written (the sources' hashes may still be being
    computed while the first shard fills)."""

    def __init__(self, out: Path, *, dtype: str, shard_tokens: int, inputs: Callable[[], dict[str, Any]],
                 saved: dict[str, Any] | None) -> None:
        self.out = out
        self.inputs = inputs
        self.dtype = dtype
        self.itemsize = np.dtype(dtype).itemsize
        self.size = shard_tokens
        self.fill = 0  # tokens in the shard being filled
        self.file: IO[bytes] | None = None
        self.digest = hashlib.sha256()
        self.shards: list[dict[str, Any]] = list(saved["shards"]) if saved else []
        # The resume point: document resume_doc, of which resume_skip tokens are already written.
        self.resume_doc = int(saved["next_doc"]) if saved else 0
        self.resume_skip = int(saved["skip"]) if saved else 0
        hint = saved.get("task") if saved else None
        # Where to restart: the task holding resume_doc and its first document (a hint written
        # with another task size is not used: everything is read again, the written part dropped).
        self.start_task, self.start_doc = (0, 0)
        if isinstance(hint, dict) and hint.get("task_bytes") == TASK_BYTES:
            self.start_task, self.start_doc = int(hint["index"]), int(hint["first_doc"])
        self.documents = self.resume_doc
        self.doc_starts: list[np.ndarray] = []  # stream offsets of the documents starting in this shard
        self.doc_records: list[np.ndarray] = []  # and their records (repeats.RECORD)
        # The piece being added: its task, first document, and documents' stream offsets.
        self.block: tuple[int, int, np.ndarray, np.ndarray] = (self.start_task, self.start_doc, np.zeros(0, np.int64),
                                                              np.zeros(0, np.int64))
        self.pending: Future[None] | None = None
        self.syncs: list[Future[None]] = []  # background flushes of the shard being filled
        self.final_docs: bytes | None = None  # the last shard's document offsets (finish() writes them)
        self.final_records = np.zeros(0, dtype=RECORD)  # and their records
        self.repeats: Repeats | None = None  # finish(): the documents that repeat an earlier one (None: not counted)
        self.unsynced = 0  # its bytes written since the last one
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="titan-shard-writer")

    @property
    def position(self) -> int:
        return len(self.shards) * self.size + self.fill

    def add_piece(self, piece: Path | memoryview, lengths: np.ndarray, records: np.ndarray, *, task: int,
                  first_doc: int) -> None:
        """The documents ``first_doc ..`` of task ``task`` (their tokens' bytes, or the file ``piece`` that holds
        them, which is then removed; cut by ``lengths``; ``records``: theirs); the part an earlier run wrote is
        dropped."""
        ends = np.cumsum(lengths)
        starts = ends - lengths
        n = int(lengths.size)
        dropped = min(n, max(0, self.resume_doc - first_doc))  # whole documents already written
        cut = int(starts[dropped]) if dropped < n else int(ends[-1]) if n else 0
        first_new = dropped
        if dropped < n and first_doc + dropped == self.resume_doc and self.resume_skip:
            cut += self.resume_skip  # its start, and this many tokens, are in the last kept shard
            first_new += 1
        base = self.position - cut  # the stream offset of this piece's first token
        self.block = (task, first_doc, starts + base, ends + base)
        self.doc_starts.append(starts[first_new:] + base)
        self.doc_records.append(records[first_new:])
        if isinstance(piece, memoryview):
            data = piece[cut * self.itemsize :]
        else:
            with piece.open("rb") as f:
                f.seek(cut * self.itemsize)
                data = memoryview(f.read())
            piece.unlink()
        done = 0
        while done < len(data):
            take = min(len(data) - done, (self.size - self.fill) * self.itemsize)
            if self.file is None:
                self.file = self._tmp(len(self.shards)).open("wb")
            chunk = data[done : done + take]
            self.file.write(chunk)
            self.digest.update(chunk)
            self.fill += take // self.itemsize
            self.unsynced += take
            done += take
            if self.unsynced >= SYNC_BYTES and self.fill < self.size:
                self.file.flush()
                self.syncs.append(self.writer.submit(os.fdatasync, self.file.fileno()))
                self.unsynced = 0
            if self.fill == self.size:
                self.flush()
        self.documents = max(self.documents, first_doc + n)

    def _tmp(self, shard: int) -> Path:
        return self.out / (shard_name(shard) + ".tmp")

    def _resume_point(self, offset: int) -> dict[str, Any]:
        """Where a later run continues when the stream is written up to ``offset`` (inside the current piece)."""
        task, first_doc, starts, ends = self.block
        i = int(np.searchsorted(ends, offset, side="right"))  # the first document not wholly written
        if i == starts.size:
            return {"next_doc": first_doc + i, "skip": 0,
                    "task": {"index": task + 1, "first_doc": first_doc + i, "task_bytes": TASK_BYTES}}
        return {"next_doc": first_doc + i, "skip": offset - int(starts[i]),
                "task": {"index": task, "first_doc": first_doc, "task_bytes": TASK_BYTES}}

    def flush(self, *, final: bool = False) -> None:
        """Hand the shard being filled to the writer thread and start the next one."""
        if self.fill == 0 or self.file is None:
            return
        end = self.position
        name = shard_name(len(self.shards))
        starts = np.concatenate(self.doc_starts) if self.doc_starts else np.zeros(0, np.int64)
        records = np.concatenate(self.doc_records) if self.doc_records else np.zeros(0, RECORD)
        here = int(np.searchsorted(starts, end, side="left"))
        docs = starts[:here].astype("<i8").tobytes()
        self.doc_starts, self.doc_records, records = [starts[here:]], [records[here:]], records[:here]
        record: dict[str, Any] = {"file": name, "tokens": self.fill, "sha256": self.digest.hexdigest()}
        self.shards.append(record)
        point = {"next_doc": self.documents, "skip": 0} if final else self._resume_point(end)
        syncs, self.syncs = self.syncs, []
        self.wait()  # one shard in flight at most
        if final:  # finish() writes the index next: no progress record, the documents kept here for it
            self.final_docs, self.final_records = docs, records
            docs, point = b"", {}
        self.pending = self.writer.submit(self._write_shard, self.file, syncs, docs, records.tobytes(), record,
                                          list(self.shards), point)
        self.file, self.digest, self.fill, self.unsynced = None, hashlib.sha256(), 0, 0

    def _write_shard(self, f: IO[bytes], syncs: list[Future[None]], docs: bytes, records: bytes,
                     record: dict[str, Any], shards: list[dict[str, Any]], point: dict[str, Any]) -> None:
        """In the writer thread: the shard, its documents (offsets and records), then the progress record naming
        it (in that order, so a record never names a shard that is not on disk). The shard's earlier flushes ran
        before this (one thread, in order); an error of theirs stops it here, as the kernel reports a
        failed write-back once, to the first sync that asks."""
        for sync in syncs:
            if sync.exception() is not None:
                f.close()
                sync.result()
        publish(f, self._tmp(len(shards) - 1), self.out / record["file"])
        if point:
            write_atomic(self.out / (record["file"] + ".docs"), docs)
            write_atomic(self.out / (record["file"] + RECORDS_SUFFIX), records)
            write_atomic(self.out / PROGRESS_NAME, json_bytes({"inputs": self.inputs(), "shards": shards, **point}))

    def wait(self) -> None:
        """Until the shard being written is on disk and recorded; its write's error, if it failed."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Finish the write in flight (a stop keeps every shard already handed over) and end the thread."""
        try:
            self.wait()
        finally:
            self.writer.shutdown(wait=True)
            if self.file is not None:  # a shard never finished: the next run writes it again
                self.file.close()
                self._tmp(len(self.shards)).unlink(missing_ok=True)
                self.file = None

    def finish(self) -> dict[str, Any]:
        self.flush(final=True)  # the last shard's fsync runs in the writer thread while documents.bin is written
        if not self.shards:  # an index of no tokens would only fail later, in the trainer
            raise ConfigError("the sources hold no documents (every file, row or text is empty); nothing to "
                              "prepare. Check the files and --text-field.")
        recorded = self.shards if self.final_docs is None else self.shards[:-1]
        starts = [np.fromfile(self.out / (s["file"] + ".docs"), dtype="<i8") for s in recorded]
        if self.final_docs is not None:
            starts.append(np.frombuffer(self.final_docs, dtype="<i8"))
        num_tokens = sum(int(s["tokens"]) for s in self.shards)
        offsets = np.concatenate([*starts, np.asarray([num_tokens], dtype="<i8")]).astype("<i8")
        write_atomic(self.out / DOCUMENTS_NAME, offsets.tobytes())
        self.wait()
        self.repeats = self._find_repeats(recorded, [s.size for s in starts], offsets)
        inputs = self.inputs()
        index = {
            "format": FORMAT, "version": VERSION, "dtype": self.dtype,
            "tokenizer": inputs["tokenizer"], "shard_tokens": self.size,
            "num_tokens": num_tokens, "num_documents": int(offsets.size - 1),
            "documents": {"file": DOCUMENTS_NAME, "sha256": hashlib.sha256(offsets.tobytes()).hexdigest()},
            "shards": self.shards, "inputs": inputs,
        }
        if self.repeats is not None:
            index["repeated_documents"] = self.repeats.documents
        # mtimes are a local cache, not part of the (byte-identical) output: see shards._check_file. Not
        # synced: after a crash that loses it, the reader hashes the files instead.
        verified = {name: os.stat(self.out / name).st_mtime_ns
                    for name in [DOCUMENTS_NAME, *(s["file"] for s in self.shards)]}
        write_atomic(self.out / VERIFIED_NAME, json_bytes(verified), sync=False)
        write_atomic(self.out / INDEX_NAME, json_bytes(index))
        (self.out / PROGRESS_NAME).unlink(missing_ok=True)
        for s in self.shards:
            (self.out / (s["file"] + ".docs")).unlink(missing_ok=True)
            (self.out / (s["file"] + RECORDS_SUFFIX)).unlink(missing_ok=True)
        return index

    def _find_repeats(self, recorded: list[dict[str, Any]], counts: list[int], offsets: np.ndarray) -> Repeats | None:
        """The repeats among all the documents (``counts``: per shard, those starting in it); None when a kept
        shard has no records that match its documents (written by an older titan-core, or removed)."""
        paths = [self.out / (s["file"] + RECORDS_SUFFIX) for s in recorded]
        if any(not p.is_file() or p.stat().st_size != n * RECORD.itemsize for p, n in zip(paths, counts)):
            return None
        # Only the digests are held (8 bytes a document, one shard's records at a time); a named document's
        # record is read again from its file.
        firsts = np.cumsum([0, *counts])
        digests = np.empty(int(firsts[-1]), dtype="<u8")
        for shard, path in enumerate(paths):
            digests[firsts[shard] : firsts[shard + 1]] = np.fromfile(path, dtype=RECORD)["digest"]
        digests[firsts[len(paths)] :] = self.final_records["digest"]

        def record_of(doc: int) -> np.void:
            shard = int(np.searchsorted(firsts, doc, side="right")) - 1
            at = doc - int(firsts[shard])
            record: np.void = (self.final_records[at] if shard == len(paths) else
                               np.fromfile(paths[shard], dtype=RECORD, count=1, offset=at * RECORD.itemsize)[0])
            return record

        return find_repeats(digests, offsets, record_of)
