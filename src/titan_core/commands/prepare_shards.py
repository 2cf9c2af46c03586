"""``titan-data prepare``: sources -> fixed-size token shards + index (format in ``shards``).

Pipeline: the parent reads documents in source order and hands chunks of them to N
worker processes (at most ``2 N`` chunks in flight, so memory stays flat); results
come back in submission order, so the bytes written do not depend on N. The parent
packs ``[BOS] doc [EOS]`` into a shard buffer and writes each full shard beside its
final name and renames it, then records in ``prepare.json`` how far it got (the
document to continue from and how many of its tokens are already written).

Interrupted in any way (Ctrl+C, SIGTERM, SIGKILL), the next call with the same
inputs re-reads the sources, skips the finished documents without tokenizing them
and writes the remaining shards; the finished shards are kept. ``index.json`` is
written last, so a folder with an index is complete.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data.doc_stream import iter_documents
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
from ..spec_factories import Tokenizer

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


# ---- workers -------------------------------------------------------------------------------------

_worker_tok: Tokenizer | None = None


def _init_worker(tokenizer: str) -> None:
    global _worker_tok
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl+C and stops the pool
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    _worker_tok = build_tokenizer(tokenizer)


def encode_chunk(texts: list[str], dtype: str) -> tuple[bytes, list[int]]:
    """``[BOS] doc [EOS]`` of every text, concatenated, as ``dtype`` bytes, and each document's length."""
    tok = _worker_tok
    assert tok is not None  # set by _init_worker
    bos, eos = tok.bos_id, tok.eos_id
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    for text in texts:
        ids = tok.encode(text)
        arr = np.empty(len(ids) + 2, dtype=dtype)
        arr[0], arr[-1] = bos, eos
        arr[1:-1] = ids
        pieces.append(arr)
        lengths.append(arr.size)
    return np.concatenate(pieces).astype(np.dtype(dtype).newbyteorder("<")).tobytes(), lengths


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


def _write_atomic(path: Path, data: bytes) -> None:
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
        except (OSError, ValueError) as e:
            raise ConfigError(f"--out {out}: its index.json cannot be read ({e}); give a new folder.") from None
        if isinstance(index, dict) and index.get("inputs") == inputs:
            return {"done": True}
        raise ConfigError(f"{other}; give a new folder or delete that one.")
    if progress_path.exists():
        try:
            saved = json.loads(progress_path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--out {out}: its {PROGRESS_NAME} cannot be read ({e}); delete the folder and "
                              "prepare again.") from None
        if not isinstance(saved, dict) or saved.get("inputs") != inputs:
            raise ConfigError(f"{other} (an unfinished prepare); rerun it with its own inputs, or give a new folder.")
        return saved
    if any(out.iterdir()):
        raise ConfigError(f"--out {out} already holds files that titan-data did not write; give a new or empty folder.")
    return None


# ---- the writer --------------------------------------------------------------------------------------


class ShardWriter:
    """Packs documents into fixed-size shards; records progress after every shard."""

    def __init__(self, out: Path, inputs: dict[str, Any], saved: dict[str, Any] | None) -> None:
        self.out = out
        self.inputs = inputs
        self.dtype = np.dtype(inputs["dtype"]).newbyteorder("<")
        self.size = int(inputs["shard_tokens"])
        self.buf = np.empty(self.size, dtype=self.dtype)
        self.fill = 0
        self.doc_starts: list[int] = []
        self.shards: list[dict[str, Any]] = list(saved["shards"]) if saved else []
        self.next_doc = int(saved["next_doc"]) if saved else 0
        self.skip = int(saved["skip"]) if saved else 0  # tokens of document next_doc already in the last shard
        self.documents = self.next_doc

    @property
    def position(self) -> int:
        return len(self.shards) * self.size + self.fill

    def add(self, tokens: np.ndarray, doc: int, skip: int = 0) -> None:
        if skip == 0:
            self.doc_starts.append(self.position)
        done = skip
        while done < tokens.size:
            take = min(tokens.size - done, self.size - self.fill)
            self.buf[self.fill : self.fill + take] = tokens[done : done + take]
            self.fill += take
            done += take
            if self.fill == self.size:
                finished = done == tokens.size
                self.flush(next_doc=doc + 1 if finished else doc, skip=0 if finished else done)
        self.documents = doc + 1

    def flush(self, *, next_doc: int, skip: int) -> None:
        if self.fill == 0:
            return
        name = shard_name(len(self.shards))
        data = self.buf[: self.fill].tobytes()
        _write_atomic(self.out / name, data)
        _write_atomic(self.out / (name + ".docs"), np.asarray(self.doc_starts, dtype="<i8").tobytes())
        import hashlib

        self.shards.append({"file": name, "tokens": self.fill, "sha256": hashlib.sha256(data).hexdigest()})
        self.fill = 0
        self.doc_starts = []
        _write_atomic(self.out / PROGRESS_NAME, _json_bytes(
            {"inputs": self.inputs, "shards": self.shards, "next_doc": next_doc, "skip": skip}))

    def finish(self) -> dict[str, Any]:
        self.flush(next_doc=self.documents, skip=0)
        starts = [np.fromfile(self.out / (s["file"] + ".docs"), dtype="<i8") for s in self.shards]
        num_tokens = sum(int(s["tokens"]) for s in self.shards)
        offsets = np.concatenate([*starts, np.asarray([num_tokens], dtype="<i8")]).astype("<i8")
        _write_atomic(self.out / DOCUMENTS_NAME, offsets.tobytes())
        import hashlib

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


def _chunks(req: PrepareRequest, first_doc: int) -> Any:
    """(first document index, texts) chunks from ``first_doc`` on; earlier documents are read and skipped."""
    doc = 0
    texts: list[str] = []
    chars = 0
    start = first_doc
    for source in req.sources:
        for text in iter_documents(source, text_field=req.text_field, hf_split=req.hf_split):
            if doc >= first_doc:
                texts.append(text)
                chars += len(text)
                if chars >= CHUNK_CHARS:
                    yield start, texts
                    start, texts, chars = doc + 1, [], 0
            doc += 1
    if texts:
        yield start, texts


def prepare(req: PrepareRequest) -> dict[str, Any]:
    """Write (or finish) the shard set; returns its index. ConfigError before anything is written for bad input."""

    if req.workers < 1:
        raise ConfigError(f"--workers {req.workers}: give at least 1 worker process.")
    if req.shard_tokens < 1:
        raise ConfigError(f"--shard-tokens {req.shard_tokens}: give a positive number of tokens per shard.")
    if not req.sources:
        raise ConfigError("give at least one SOURCE (a file, a folder, builtin or hf:<name>).")
    tok = build_tokenizer(req.tokenizer)
    inputs = describe_inputs(req, tok)
    saved = _check_out(req, inputs)
    if saved is not None and saved.get("done"):
        index = json.loads((req.out / INDEX_NAME).read_text())
        if req.progress:
            print(f"prepare: {req.out} is already complete ({index['num_tokens']:,} tokens in "
                  f"{index['num_documents']:,} documents)", file=sys.stderr)
        return dict(index)
    created = not req.out.exists()
    req.out.mkdir(parents=True, exist_ok=True)
    for leftover in req.out.glob("*.tmp"):  # a write that a SIGKILL cut short
        leftover.unlink()
    writer = ShardWriter(req.out, inputs, saved)
    progress = Progress(req.progress)
    try:
        _run(req, writer, progress)
    except ConfigError:
        if created and not writer.shards:  # nothing worth keeping: leave no half-made folder behind
            import shutil

            shutil.rmtree(req.out, ignore_errors=True)
        raise
    index = writer.finish()
    progress.show(index["num_documents"], index["num_tokens"], final=True)
    return index


def _run(req: PrepareRequest, writer: ShardWriter, progress: Progress) -> None:
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    dtype = writer.inputs["dtype"]
    resume_doc, resume_skip = writer.next_doc, writer.skip
    with ctx.Pool(req.workers, initializer=_init_worker, initargs=(req.tokenizer,)) as pool:
        pending: deque[tuple[int, Any]] = deque()

        def drain_one() -> None:
            first, result = pending.popleft()
            data, lengths = result.get()
            tokens = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"))
            pos = 0
            for i, n in enumerate(lengths):
                doc = first + i
                writer.add(tokens[pos : pos + n], doc, skip=resume_skip if doc == resume_doc else 0)
                pos += n
            progress.show(writer.documents, writer.position)

        try:
            for first, texts in _chunks(req, resume_doc):
                pending.append((first, pool.apply_async(encode_chunk, (texts, dtype))))
                while len(pending) >= 2 * req.workers:
                    drain_one()
            while pending:
                drain_one()
        except BaseException:
            pool.terminate()
            raise
