"""``titan-data prepare``: sources -> fixed-size token shards + index (format in ``shards``).

Pipeline: the parent cuts the sources into tasks (``prepare_tasks``: pieces named by file
and byte range or row group, the same for any number of workers) and hands them to N worker
processes, at most ``3 N`` in flight so memory stays flat (``prepare_tasks.Workers``). Each worker reads, parses and
tokenizes its piece and returns a token array and the documents' lengths. Results are taken
in task order, so the bytes written do not depend on N. The parent copies the arrays into a
shard buffer; a full shard goes to a writer thread (while the parent fills a second buffer),
which writes it beside its final name and renames it, then records in ``prepare.json`` how
far it got (the document to continue from, how many of its tokens are already written, and
the task that holds it).

Interrupted in any way (Ctrl+C, SIGTERM, SIGKILL), the next call with the same inputs
restarts at that task (earlier documents are not read again where the source can be
addressed, nor tokenized), drops what is already written and writes the remaining shards;
the finished shards are kept. ``index.json`` is written last, so a folder with an index is
complete.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data.shards import (
    DOCUMENTS_NAME,
    FORMAT,
    INDEX_NAME,
    VERIFIED_NAME,
    VERSION,
    dtype_for_vocab,
    file_sha256,
    shard_name,
    tokenizer_fingerprint,
)
from ..data.sources import HF_PREFIX, source_files
from ..errors import ConfigError
from ..plan.tokenizer import build_tokenizer
from ..plugin.spec_factories import Tokenizer
from .prepare_checks import check_finished_index, check_out_place, check_saved_progress, check_settings
from .prepare_tasks import TASK_BYTES, Workers, plan_tasks

PROGRESS_NAME = "prepare.json"
CHUNK_CHARS = 1 << 20  # about this much text per task handed to a worker


@dataclass(frozen=True)
class PrepareRequest:
    sources: list[str]
    tokenizer: str
    out: Path
    workers: int = 1
    shard_tokens: int = 1 << 26
    text_field: str = "text"
    hf_split: str = "train"
    allow_download: bool = False
    progress: bool = True


# ---- inputs ----------------------------------------------------------------------------------------


def describe_inputs(req: PrepareRequest, tok: Tokenizer) -> dict[str, Any]:
    """Everything the output depends on (checked again on resume); ConfigError for a bad input."""
    sources: list[dict[str, Any]] = []
    for source in req.sources:
        if source.startswith(HF_PREFIX):
            if not req.allow_download:
                raise ConfigError(f'source "{source}" needs a download from the Hugging Face hub; pass '
                                  "--allow-download to permit it, or give local files.")
            sources.append({"source": source, "split": req.hf_split})
            continue
        if source == "builtin":
            sources.append({"source": "builtin"})
            continue
        files = [{"path": str(p.resolve()), "size": p.stat().st_size, "sha256": file_sha256(p)}
                 for p in source_files(source)]
        sources.append({"source": str(Path(source).expanduser().resolve()), "files": files})
    return {
        "format": FORMAT, "version": VERSION, "dtype": dtype_for_vocab(tok.vocab_size),
        "shard_tokens": req.shard_tokens, "text_field": req.text_field,
        "tokenizer": {"fingerprint": tokenizer_fingerprint(tok), "name": str(getattr(tok, "name", type(tok).__name__)),
                      "vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id},
        "sources": sources,
    }


def _write_atomic(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


def _check_out(req: PrepareRequest, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The saved progress to continue from; None for a fresh folder. ConfigError when ``--out`` holds anything else."""
    out = req.out
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder (new, or one an earlier prepare wrote).")
    if not out.exists():
        return None
    index_path, progress_path = out / INDEX_NAME, out / PROGRESS_NAME
    other = f"--out {out} holds a shard set prepared from other inputs (sources, tokenizer or settings differ)"
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"--out {out}: its index.json cannot be read ({str(e)[:200]}); give a new folder.") from None
        if isinstance(index, dict) and index.get("inputs") == inputs:
            check_finished_index(out, index)
            return {"done": True}
        raise ConfigError(f"{other}; give a new folder or delete that one.")
    if progress_path.exists():
        try:
            saved = json.loads(progress_path.read_text())
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"--out {out}: its {PROGRESS_NAME} cannot be read ({str(e)[:200]}); delete the folder and "
                              "prepare again.") from None
        if not isinstance(saved, dict) or saved.get("inputs") != inputs:
            raise ConfigError(f"{other} (an unfinished prepare); rerun it with its own inputs, or give a new folder.")
        check_saved_progress(out, saved, req.shard_tokens, np.dtype(inputs["dtype"]).itemsize, PROGRESS_NAME)
        return saved
    if any(out.iterdir()):
        raise ConfigError(f"--out {out} already holds files that titan-data did not write; give a new or empty folder.")
    return None


# ---- the writer --------------------------------------------------------------------------------------


def _buffer(size: int, dtype: np.dtype[Any]) -> np.ndarray:
    try:
        return np.empty(size, dtype=dtype)
    except MemoryError:
        raise ConfigError(f"--shard-tokens {size}: a shard buffer of {size * dtype.itemsize / 2**30:.1f} GiB does not "
                          "fit in memory; give a smaller --shard-tokens (the default is 2^26).") from None


class ShardWriter:
    """Packs blocks of documents into fixed-size shards; records progress after every shard."""

    def __init__(self, out: Path, inputs: dict[str, Any], saved: dict[str, Any] | None) -> None:
        self.out = out
        self.inputs = inputs
        self.dtype = np.dtype(inputs["dtype"]).newbyteorder("<")
        self.size = int(inputs["shard_tokens"])
        self.buf = _buffer(self.size, self.dtype)
        self.fill = 0
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
        self.doc_starts: list[np.ndarray] = []  # stream offsets of the documents starting in the buffer
        # The block being added: its task, first document, and documents' stream offsets.
        self.block: tuple[int, int, np.ndarray, np.ndarray] = (self.start_task, self.start_doc, np.zeros(0, np.int64),
                                                              np.zeros(0, np.int64))
        # A full shard is hashed, written and recorded by one background thread while the next one
        # fills a second buffer: at 64M tokens a shard is 128 MB to hash, write and fsync, which
        # would otherwise stop the parent, and with it every worker, for most of a second per shard.
        self.spare: np.ndarray | None = None  # the buffer the writer thread may still be reading
        self.pending: Future[None] | None = None
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="titan-shard-writer")

    @property
    def position(self) -> int:
        return len(self.shards) * self.size + self.fill

    def add_block(self, tokens: np.ndarray, lengths: np.ndarray, *, task: int, first_doc: int) -> None:
        """The documents ``first_doc ..`` of task ``task`` (``tokens``, cut by ``lengths``); the part an
        earlier run wrote is dropped."""
        ends = np.cumsum(lengths)
        starts = ends - lengths
        n = int(lengths.size)
        dropped = min(n, max(0, self.resume_doc - first_doc))  # whole documents already written
        cut = int(starts[dropped]) if dropped < n else int(tokens.size)
        first_new = dropped
        if dropped < n and first_doc + dropped == self.resume_doc and self.resume_skip:
            cut += self.resume_skip  # its start, and this many tokens, are in the last kept shard
            first_new += 1
        base = self.position - cut  # the stream offset of this block's first token
        self.block = (task, first_doc, starts + base, ends + base)
        self.doc_starts.append(starts[first_new:] + base)
        data = tokens[cut:]
        done = 0
        while done < data.size:
            take = min(data.size - done, self.size - self.fill)
            self.buf[self.fill : self.fill + take] = data[done : done + take]
            self.fill += take
            done += take
            if self.fill == self.size:
                self.flush()
        self.documents = max(self.documents, first_doc + n)

    def _resume_point(self, offset: int) -> dict[str, Any]:
        """Where a later run continues when the stream is written up to ``offset`` (inside the current block)."""
        task, first_doc, starts, ends = self.block
        i = int(np.searchsorted(ends, offset, side="right"))  # the first document not wholly written
        if i == starts.size:
            return {"next_doc": first_doc + i, "skip": 0,
                    "task": {"index": task + 1, "first_doc": first_doc + i, "task_bytes": TASK_BYTES}}
        return {"next_doc": first_doc + i, "skip": offset - int(starts[i]),
                "task": {"index": task, "first_doc": first_doc, "task_bytes": TASK_BYTES}}

    def flush(self, *, final: bool = False) -> None:
        """Hand the filled part of the buffer to the writer thread and go on in the other buffer."""
        if self.fill == 0:
            return
        end = self.position
        name = shard_name(len(self.shards))
        starts = np.concatenate(self.doc_starts) if self.doc_starts else np.zeros(0, np.int64)
        here = int(np.searchsorted(starts, end, side="left"))
        docs = starts[:here].astype("<i8").tobytes()
        self.doc_starts = [starts[here:]]
        record: dict[str, Any] = {"file": name, "tokens": self.fill}  # its sha256 is added by the writer
        self.shards.append(record)
        point = {"next_doc": self.documents, "skip": 0} if final else self._resume_point(end)
        self.wait()  # one write in flight at most: the spare buffer is free again
        self.pending = self.writer.submit(self._write_shard, self.buf[: self.fill], docs, record, list(self.shards),
                                          point)
        self.buf, self.spare = (self.spare if self.spare is not None else _buffer(self.size, self.dtype)), self.buf
        self.fill = 0

    def _write_shard(self, data: np.ndarray, docs: bytes, record: dict[str, Any], shards: list[dict[str, Any]],
                     point: dict[str, Any]) -> None:
        """In the writer thread: the shard, its documents, then the progress record naming it (in that
        order, so a record never names a shard that is not on disk)."""
        raw = data.data.cast("B")  # no copy: the buffer is not touched until the next wait()
        _write_atomic(self.out / record["file"], raw)
        record["sha256"] = hashlib.sha256(raw).hexdigest()
        _write_atomic(self.out / (record["file"] + ".docs"), docs)
        _write_atomic(self.out / PROGRESS_NAME, _json_bytes({"inputs": self.inputs, "shards": shards, **point}))

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

    def finish(self) -> dict[str, Any]:
        self.flush(final=True)
        self.wait()
        if not self.shards:  # an index of no tokens would only fail later, in the trainer
            raise ConfigError("the sources hold no documents (every file, row or text is empty); nothing to "
                              "prepare. Check the files and --text-field.")
        starts = [np.fromfile(self.out / (s["file"] + ".docs"), dtype="<i8") for s in self.shards]
        num_tokens = sum(int(s["tokens"]) for s in self.shards)
        offsets = np.concatenate([*starts, np.asarray([num_tokens], dtype="<i8")]).astype("<i8")
        _write_atomic(self.out / DOCUMENTS_NAME, offsets.tobytes())
        index = {
            "format": FORMAT, "version": VERSION, "dtype": self.inputs["dtype"],
            "tokenizer": self.inputs["tokenizer"], "shard_tokens": self.size,
            "num_tokens": num_tokens, "num_documents": int(offsets.size - 1),
            "documents": {"file": DOCUMENTS_NAME, "sha256": hashlib.sha256(offsets.tobytes()).hexdigest()},
            "shards": self.shards, "inputs": self.inputs,
        }
        # mtimes are a local cache, not part of the (byte-identical) output: see shards._check_file.
        verified = {name: os.stat(self.out / name).st_mtime_ns
                    for name in [DOCUMENTS_NAME, *(s["file"] for s in self.shards)]}
        _write_atomic(self.out / VERIFIED_NAME, _json_bytes(verified))
        _write_atomic(self.out / INDEX_NAME, _json_bytes(index))
        (self.out / PROGRESS_NAME).unlink(missing_ok=True)
        for s in self.shards:
            (self.out / (s["file"] + ".docs")).unlink(missing_ok=True)
        return index


# ---- the run -----------------------------------------------------------------------------------------


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def show(self, docs: int, tokens: int, *, final: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < (0.5 if self.tty else 10.0)):
            return
        self.last = now
        rate = tokens / max(now - self.start, 1e-9)
        line = f"prepare: {docs:,} documents | {tokens:,} tokens | {rate:,.0f} tokens/s"
        print(("\r" + line) if self.tty else line, end="\n" if final or not self.tty else "", file=sys.stderr,
              flush=True)


def prepare(req: PrepareRequest) -> dict[str, Any]:
    """Write (or finish) the shard set; returns its index. ConfigError before anything is written for bad input."""

    check_settings(req.workers, req.shard_tokens)
    if not req.sources:
        raise ConfigError("give at least one SOURCE (a file, a folder, builtin or hf:<name>).")
    check_out_place(req.out, req.sources)
    tok = build_tokenizer(req.tokenizer)
    inputs = describe_inputs(req, tok)
    saved = _check_out(req, inputs)
    if saved is not None and saved.get("done"):
        index = json.loads((req.out / INDEX_NAME).read_text())
        if req.progress:
            print(f"prepare: {req.out} is already complete ({index['num_tokens']:,} tokens in "
                  f"{index['num_documents']:,} documents)", file=sys.stderr)
        return dict(index)
    writer = ShardWriter(req.out, inputs, saved)  # its buffers first: a --shard-tokens too large writes nothing
    created = not req.out.exists()
    req.out.mkdir(parents=True, exist_ok=True)
    for leftover in req.out.glob("*.tmp"):  # a write that a SIGKILL cut short
        leftover.unlink()
    progress = Progress(req.progress)
    try:
        try:
            _run(req, writer, progress, tok)
            index = writer.finish()
        finally:
            writer.close()
    except ConfigError:
        if created and not writer.shards:  # nothing worth keeping: leave no half-made folder behind
            import shutil

            shutil.rmtree(req.out, ignore_errors=True)
        raise
    progress.show(index["num_documents"], index["num_tokens"], final=True)
    return index


def _run(req: PrepareRequest, writer: ShardWriter, progress: Progress, tok: Tokenizer) -> None:
    tasks = itertools.islice(plan_tasks(req.sources, text_field=req.text_field, hf_split=req.hf_split),
                             writer.start_task, None)
    workers = Workers(req.workers, tokenizer=req.tokenizer, dtype=writer.inputs["dtype"], text_field=req.text_field,
                      tok=tok, spill=req.out)
    done = sent = writer.start_task
    next_doc = writer.start_doc
    stop = True
    try:
        for task in tasks:
            workers.submit(sent, task)
            sent += 1
            while sent - done >= 3 * req.workers:  # at most 3 tasks in flight per worker: memory stays flat
                next_doc = _take(workers, writer, done, next_doc)
                done += 1
                progress.show(writer.documents, writer.position)
        while done < sent:
            next_doc = _take(workers, writer, done, next_doc)
            done += 1
            progress.show(writer.documents, writer.position)
        stop = False
    finally:
        workers.close(stop=stop)


def _take(workers: Workers, writer: ShardWriter, task: int, first_doc: int) -> int:
    """Add task ``task``'s documents (numbered from ``first_doc``) to the shards; the next document's number."""
    tokens, lengths = workers.result(task)
    writer.add_block(tokens, lengths, task=task, first_doc=first_doc)
    return first_doc + int(lengths.size)
