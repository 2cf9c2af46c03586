"""The work of ``titan-data prepare``, cut into tasks that do not depend on the number of workers.

A task names a piece of the sources by where it lies: a byte range of whole lines of a
``.jsonl`` file, a row group of a ``.parquet`` file, a ``.txt`` file. The worker reads,
parses and tokenizes it and returns two arrays: the tokens of its documents, each as
``[BOS] doc [EOS]``, and each document's length. So neither text nor a per-document Python
object crosses a process boundary, and the parent, which only copies arrays into shards, uses
little of a core: N workers keep N cores busy. Only what cannot be named by place travels as
text: a ``.json`` list, the built-in corpus and ``hf:`` streams.

The cut depends on the sources alone (``TASK_BYTES``), so the documents of task ``k`` are the
same for any N; the parent writes results in task order, and a resume restarts at the task
that holds the first unfinished document (``prepare.json`` records it).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from ..data.corpus import builtin_documents
from ..data.doc_stream import (
    hub_rows,
    json_is_list,
    json_lines,
    json_list,
    line_ranges,
    parquet_group,
    parquet_row_groups,
)
from ..data.sources import HF_PREFIX, _read_file, source_files
from ..errors import TitanError
from ..plan.tokenizer import build_tokenizer
from ..plugin.spec_factories import Tokenizer

TASK_BYTES = 1 << 18  # about this much text per task: small enough that N workers end together


@dataclass(frozen=True)
class Task:
    """One piece of the sources (``kind``: lines, parquet, txt or texts; texts-file on its way to a worker)."""

    kind: str
    path: str = ""
    start: int = 0  # lines: first byte; parquet: row group
    end: int = 0  # lines: end byte; parquet: the group's first row in the file
    texts: tuple[str, ...] = ()


def plan_tasks(sources: list[str], *, text_field: str, hf_split: str) -> Iterator[Task]:
    """Every task of ``sources``, in source order (local sources were checked by the caller)."""
    for source in sources:
        if source == "builtin":
            yield from _text_tasks(builtin_documents())
        elif source.startswith(HF_PREFIX):
            yield from _text_tasks(hub_rows(source[len(HF_PREFIX):], text_field=text_field, split=hf_split))
        else:
            for path in source_files(source):
                yield from _file_tasks(path, text_field)


def _file_tasks(path: Path, text_field: str) -> Iterator[Task]:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        yield Task("txt", str(path))
    elif suffix == ".jsonl" or (suffix == ".json" and not json_is_list(path)):
        for start, end in line_ranges(path, path.stat().st_size, TASK_BYTES):
            yield Task("lines", str(path), start, end)
    elif suffix == ".json":
        yield from _text_tasks(json_list(path, text_field))
    else:
        first_row = 0
        for group, rows in enumerate(parquet_row_groups(path, text_field)):
            yield Task("parquet", str(path), group, first_row)
            first_row += rows


def _text_tasks(texts: Iterable[str]) -> Iterator[Task]:
    chunk: list[str] = []
    chars = 0
    for text in texts:
        chunk.append(text)
        chars += len(text)
        if chars >= TASK_BYTES:
            yield Task("texts", texts=tuple(chunk))
            chunk, chars = [], 0
    if chunk:
        yield Task("texts", texts=tuple(chunk))


def task_texts(task: Task, text_field: str) -> Iterable[str]:
    path = Path(task.path)
    if task.kind == "lines":
        return json_lines(path, task.start, task.end, text_field)
    if task.kind == "parquet":
        return parquet_group(path, task.start, task.end, text_field)
    if task.kind == "txt":
        return _read_file(path, text_field=text_field)
    return task.texts


def encode_documents(texts: Iterable[str], tok: Tokenizer, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(``[BOS] doc [EOS]`` of every text, concatenated, little-endian ``dtype``; each document's length)."""
    # tiktoken can hand the ids over as an array: no Python int per token (the ids equal encode()'s).
    as_array = getattr(tok, "encode_array", None)
    pieces = [as_array(t) if as_array is not None else np.asarray(tok.encode(t), dtype=np.int64) for t in texts]
    lengths = np.fromiter((p.size + 2 for p in pieces), dtype=np.int64, count=len(pieces))
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]) if len(pieces) else 0, dtype=np.dtype(dtype).newbyteorder("<"))
    starts = ends - lengths
    out[starts] = tok.bos_id
    out[ends - 1] = tok.eos_id
    for piece, start in zip(pieces, starts.tolist()):
        out[start + 1 : start + 1 + piece.size] = piece
    return out, lengths


# ---- the worker processes ----------------------------------------------------------------------------
#
# Plain processes, one pipe each, rather than a multiprocessing.Pool: task k goes to worker
# k mod N and its result is read back from that worker's pipe in task order. The Pool's
# handler threads and per-task bookkeeping cost the parent a core's 35 ms per 40 tasks, a
# tenth of its whole share; this costs it almost nothing. Every message to a worker is small
# (the texts of a "texts" task go through a file), so the parent never blocks on a send while
# that worker blocks on sending a result: there is no deadlock.


def spilled_texts(texts: Sequence[str]) -> bytes:
    """A task's texts as the file a worker reads: a JSON list (ASCII escapes keep any str, lone
    surrogates included), never a pickle, so a file swapped under the spill folder runs no code."""
    return json.dumps(list(texts)).encode("ascii")


def read_spilled_texts(path: Path) -> tuple[str, ...]:
    try:
        texts = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise TitanError(f"titan-data: the task file {path} cannot be read back ({exc}); it is written and read "
                         f"by prepare itself: run the same command again.") from None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise TitanError(f"titan-data: the task file {path} does not hold a list of texts; it is written and read "
                         f"by prepare itself: run the same command again.")
    return tuple(texts)


def _worker_main(conn: Connection, tokenizer: str, dtype: str, text_field: str, tok: Tokenizer | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl+C and stops the workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        tok = tok if tok is not None else build_tokenizer(tokenizer)
        while (task := conn.recv()) is not None:
            try:
                if task.kind == "texts-file":
                    path = Path(task.path)
                    task = Task("texts", texts=read_spilled_texts(path))
                    path.unlink()
                conn.send(("ok", *encode_documents(task_texts(task, text_field), tok, dtype)))
            except TitanError as exc:  # a bad row: the parent reports it
                conn.send(("error", exc))
    except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone or stopping us
        pass


# Seconds a worker has to end once asked (it is idle by then: every result was taken, or the run is stopping).
WORKER_EXIT_S = 5.0


class Workers:
    """N tokenizer processes; ``submit`` tasks in order, then ``result`` of each in the same order."""

    def __init__(self, n: int, *, tokenizer: str, dtype: str, text_field: str, tok: Tokenizer, spill: Path) -> None:
        fork = "fork" in mp.get_all_start_methods()
        ctx: Any = mp.get_context("fork" if fork else "spawn")  # its Process: typeshed knows it per context only
        self.spill = spill  # where the texts of a "texts" task wait for their worker
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            # Forked workers share the parent's tokenizer (a large vocabulary is not loaded N more times).
            proc = ctx.Process(target=_worker_main, args=(child, tokenizer, dtype, text_field, tok if fork else None),
                               daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def submit(self, index: int, task: Task) -> None:
        if task.kind == "texts":
            fd, name = tempfile.mkstemp(dir=self.spill, prefix="task-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(spilled_texts(task.texts))
            task = Task("texts-file", name)
        self.conns[index % len(self.conns)].send(task)

    def result(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        conn = self.conns[index % len(self.conns)]
        try:
            status, *payload = conn.recv()
        except EOFError:
            raise TitanError(f"a titan-data worker process died (exit code {self.procs[index % len(self.procs)].exitcode}"
                             "), perhaps killed for lack of memory; the finished shards are kept: run the same "
                             "command again, with fewer --workers if memory is short.") from None
        if status == "error":
            raise payload[0]
        return payload[0], payload[1]

    def close(self, *, stop: bool) -> None:
        """Ask the workers to finish (``stop``: end them now), then wait for them."""
        for conn, proc in zip(self.conns, self.procs):
            if stop:
                proc.terminate()
            else:
                try:
                    conn.send(None)
                except OSError:
                    pass
        for conn, proc in zip(self.conns, self.procs):
            proc.join(timeout=WORKER_EXIT_S)
            if proc.is_alive():
                # A forked worker inherits the caller's SIGTERM handler until it installs its own, so a stop
                # that reaches it in its first moments can be swallowed (seen: a worker left waiting for
                # work, and this join waiting on it for ever). Nothing it holds is needed any more.
                proc.kill()
                proc.join()
            conn.close()
        for left in self.spill.glob("task-*.tmp"):  # texts no worker took (a stop)
            left.unlink(missing_ok=True)
