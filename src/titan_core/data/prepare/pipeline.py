"""``titan-data prepare``: sources -> fixed-size token shards + index (the format ``data/shards.py`` reads).

Pipeline: the parent cuts the sources into tasks (``tasks.py``: pieces named by file and byte
range or row group, the same for any number of workers) and hands them to N worker processes
(``workers.py``; with one worker the command's own process tokenizes), at most
``WINDOW_PER_WORKER * N`` ahead of the shards so disk and memory stay flat. Each worker reads,
parses and tokenizes its task and writes the tokens to a piece file;
the parent appends the pieces in task order to the shard being filled (``writer.py``), so the
bytes written do not depend on N. The parent only waits, reads pieces back from the page cache
and hashes them: the cores are the workers'. After every shard ``prepare.json`` records how far
it got (the document to continue from, how many of its tokens are already written, and the task
that holds it).

The sources' SHA-256 (recorded in the index, compared on resume) is computed by a thread, each file's
before anything reads that file, while the earlier files are packed; an existing ``--out`` is checked
against them first. Each file is hashed again once nothing reads it, and the index is written only if the
two agree (``provenance.py``). Documents that repeat an earlier one word for word are counted and named
(``repeats.py``).

Interrupted in any way (Ctrl+C, SIGTERM, SIGKILL), the next call with the same inputs
restarts at that task (earlier documents are not read again where the source can be
addressed, nor tokenized), drops what is already written and writes the remaining shards;
the finished shards are kept. ``index.json`` is written last, so a folder with an index is
complete.

Nothing here imports torch: the command starts in the time Python and the tokenizer take.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ...errors import ConfigError
from ...runtime.regular_files import read_regular
from ..shard_format import FORMAT, INDEX_NAME, VERSION, dtype_for_vocab, tokenizer_fingerprint
from ..sources import HF_PREFIX, source_files
from .checks import check_finished_index, check_out_place, check_saved_progress, check_settings
from .provenance import ReadOrder, SourceHashes, added_files, find_duplicates, listed_state
from .repeats import document_records, repeats_line
from .tasks import Task, encode_documents, plan_tasks, read_task
from .writer import PROGRESS_NAME, ShardWriter

if TYPE_CHECKING:  # its module imports torch; prepare never needs it at run time
    from ...plugin.spec_factories import Tokenizer

WINDOW_PER_WORKER = 4  # tasks handed out ahead of the shards, per worker (each waits as a piece file at most)


# A NamedTuple, not a dataclass: defined in ~0.15 ms at import against ~1 ms, and prepare's start-up counts.
class PrepareRequest(NamedTuple):
    sources: list[str]
    tokenizer: str
    out: Path
    workers: int = 1
    shard_tokens: int = 1 << 26
    text_field: str = "text"
    hf_split: str = "train"
    allow_download: bool = False
    progress: bool = True
    hf_timeout_s: float = 60.0  # an hf: source silent this long stops prepare (--hf-timeout)
    keep_duplicates: bool = False  # pack a link to, or a byte-identical copy of, a file already read (provenance.py)


# ---- inputs ----------------------------------------------------------------------------------------


def _source_files(req: PrepareRequest) -> list[list[Path] | None]:
    """Each source's files (None: builtin or hf); ConfigError for a source that cannot be read."""
    found: list[list[Path] | None] = []
    for source in req.sources:
        if source.startswith(HF_PREFIX) and not req.allow_download:
            raise ConfigError(f'source "{source}" needs a download from the Hugging Face hub; pass '
                              "--allow-download to permit it, or give local files.")
        found.append(None if source == "builtin" or source.startswith(HF_PREFIX) else list(source_files(source)))
    return found


def _inputs(sources: list[str], files: list[list[Path] | None]) -> list[Path | str]:
    """Per input number (``plan_tasks``): its file, or the source (builtin, hf:) that is not a file."""
    return [item for source, paths in zip(sources, files) for item in (paths if paths is not None else [source])]


def describe_inputs(req: PrepareRequest, tok: Tokenizer, files: list[list[Path] | None],
                    sha256: Callable[[Path], str], *, duplicates: dict[int, Path] | None = None) -> dict[str, Any]:
    """Everything the output depends on (checked again on resume): settings, tokenizer, every file's hash
    (``sha256``: taken before anything read the file; ``duplicates``: by input number, the files skipped as a
    repeat of another, recorded with ``duplicate_of``; by number, since a file listed twice has one path)."""
    repeats = duplicates or {}

    def entry(p: Path, number: int) -> dict[str, Any]:
        record = {"path": str(p.resolve()), "size": p.stat().st_size, "sha256": sha256(p)}
        if number in repeats:
            record["duplicate_of"] = str(repeats[number].resolve())
        return record

    sources: list[dict[str, Any]] = []
    number = 0  # each input's number, counted as plan_tasks counts: builtin and hf: take one
    for source, paths in zip(req.sources, files):
        if source.startswith(HF_PREFIX):
            sources.append({"source": source, "split": req.hf_split})
            number += 1
        elif paths is None:
            sources.append({"source": "builtin"})
            number += 1
        else:
            sources.append({"source": str(Path(source).expanduser().resolve()),
                            "files": [entry(p, number + i) for i, p in enumerate(paths)]})
            number += len(paths)
    return {
        "format": FORMAT, "version": VERSION, "dtype": dtype_for_vocab(tok.vocab_size),
        "shard_tokens": req.shard_tokens, "text_field": req.text_field,
        "tokenizer": {"fingerprint": tokenizer_fingerprint(tok), "name": str(getattr(tok, "name", type(tok).__name__)),
                      "vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id},
        "sources": sources,
    }


def _check_out(req: PrepareRequest, inputs: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The saved progress to continue from; None for a fresh folder. ConfigError when ``--out`` holds anything
    else. ``inputs`` (the sources' hashes) is waited for only when ``--out`` holds an earlier prepare's records."""
    out = req.out
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder (new, or one an earlier prepare wrote).")
    if not out.exists():
        return None
    index_path, progress_path = out / INDEX_NAME, out / PROGRESS_NAME
    other = f"--out {out} holds a shard set prepared from other inputs (sources, tokenizer or settings differ)"
    if index_path.exists():
        try:
            index = json.loads(read_regular(index_path))
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"--out {out}: its index.json cannot be read ({str(e)[:200]}); give a new folder.") from None
        if isinstance(index, dict) and index.get("inputs") == inputs():
            check_finished_index(out, index)
            return {"done": True}
        raise ConfigError(f"{other}; give a new folder or delete that one.")
    if progress_path.exists():
        try:
            saved = json.loads(read_regular(progress_path))
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"--out {out}: its {PROGRESS_NAME} cannot be read ({str(e)[:200]}); delete the folder and "
                              "prepare again.") from None
        if not isinstance(saved, dict) or saved.get("inputs") != inputs():
            raise ConfigError(f"{other} (an unfinished prepare); rerun it with its own inputs, or give a new folder.")
        check_saved_progress(out, saved, req.shard_tokens, np.dtype(inputs()["dtype"]).itemsize, PROGRESS_NAME)
        return saved
    if any(out.iterdir()):
        raise ConfigError(f"--out {out} already holds files that titan-data did not write; give a new or empty folder.")
    return None


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


def prepare(req: PrepareRequest, load_tokenizer: Callable[[str], Tokenizer]) -> dict[str, Any]:
    """Write (or finish) the shard set; returns its index. ConfigError before anything is written for bad input.

    ``load_tokenizer`` turns ``req.tokenizer`` into a tokenizer (the command passes ``data.tokenizer``'s
    reader; a worker started by spawn, not fork, calls it again, so it must be a module-level function)."""

    check_settings(req.workers, req.shard_tokens, req.hf_timeout_s)
    if not req.sources:
        raise ConfigError("give at least one SOURCE (a file, a folder, builtin or hf:<name>).")
    check_out_place(req.out, req.sources)
    tok = load_tokenizer(req.tokenizer)
    tokenizer_fingerprint(tok)  # a tokenizer without one is refused before anything is read
    files = _source_files(req)
    listed = listed_state(files)  # before anything reads them: compared once packing is done
    hashes: dict[Path, str] = {}
    repeats = [] if req.keep_duplicates else find_duplicates(files, hashes)
    stopping = threading.Event()  # a run that ends early does not wait for the rest of the hashing
    source_hashes = SourceHashes(files, hashes, stopping.is_set)
    describing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="titan-source-describe")
    try:
        described = describing.submit(describe_inputs, req, tok, files, source_hashes.sha256,
                                      duplicates={d.number: d.of for d in repeats})
        saved = _check_out(req, described.result)
        if saved is not None and saved.get("done"):
            index = json.loads(read_regular(req.out / INDEX_NAME))
            if req.progress:
                print(f"prepare: {req.out} is already complete ({index['num_tokens']:,} tokens in "
                      f"{index['num_documents']:,} documents)", file=sys.stderr)
            return dict(index)
        created = not req.out.exists()
        req.out.mkdir(parents=True, exist_ok=True)
        for leftover in req.out.glob("*.tmp"):  # a write or a piece that a SIGKILL cut short
            leftover.unlink()
        writer = ShardWriter(req.out, dtype=dtype_for_vocab(tok.vocab_size), shard_tokens=req.shard_tokens,
                             inputs=described.result, saved=saved)
        progress = Progress(req.progress)
        for line in dict.fromkeys(repeat.line() for repeat in repeats):  # a file listed three times: said once
            print(line, file=sys.stderr, flush=True)
        order = ReadOrder(source_hashes, _inputs(req.sources, files))
        try:
            try:
                _run(req, writer, progress, tok, load_tokenizer, files, frozenset(d.number for d in repeats), order)
                order.all_packed()
                source_hashes.check(listed, req.out)  # before the index: it must describe what was packed
                index = writer.finish()
            finally:
                writer.close()
        except ConfigError:
            if created and not writer.shards:  # nothing worth keeping: leave no half-made folder behind
                import shutil

                shutil.rmtree(req.out, ignore_errors=True)
            raise
    finally:
        stopping.set()
        source_hashes.close()
        describing.shutdown(wait=True)
    progress.show(index["num_documents"], index["num_tokens"], final=True)
    _tell_repeats(writer, order.inputs)
    for path in added_files(req.sources, files):
        print(f"prepare: {path} appeared after prepare listed its folder; it is not in this shard set (prepare again "
              "into a new --out to include it)", file=sys.stderr, flush=True)
    return index


def _tell_repeats(writer: ShardWriter, inputs: Sequence[Path | str]) -> None:
    """One line on the documents packed again as repeats of earlier ones (none: nothing to say)."""
    if writer.repeats is None:
        print("prepare: documents that repeat an earlier one were not counted: the kept shards this prepare "
              "continued have no record of their documents' digests (an older titan-core wrote them)",
              file=sys.stderr, flush=True)
    elif writer.repeats.documents:
        print(repeats_line(writer.repeats, inputs), file=sys.stderr, flush=True)


def _run(req: PrepareRequest, writer: ShardWriter, progress: Progress, tok: Tokenizer,
         load_tokenizer: Callable[[str], Tokenizer], files: list[list[Path] | None], skip: frozenset[int],
         order: ReadOrder) -> None:
    tasks = itertools.islice(plan_tasks(req.sources, text_field=req.text_field, hf_split=req.hf_split,
                                        hf_timeout_s=req.hf_timeout_s, files=files, skip=skip, opening=order.opening),
                             writer.start_task, None)
    if req.workers == 1:
        _run_here(req, writer, progress, tok, tasks, order)
    else:
        _run_workers(req, writer, progress, tok, load_tokenizer, tasks, order)


def _run_here(req: PrepareRequest, writer: ShardWriter, progress: Progress, tok: Tokenizer,
              tasks: Iterator[Task], order: ReadOrder) -> None:
    """One worker: the command's own process tokenizes, with no second process to start, feed or wait for
    (the source hashing and the disk writes run in threads that release the GIL). Same tasks, same order,
    same bytes as N workers."""
    next_doc = writer.start_doc
    for index, task in enumerate(tasks, start=writer.start_task):
        order.handed(index)
        docs = read_task(task, req.text_field)
        tokens, lengths = encode_documents(docs.texts, tok, writer.dtype)
        records = document_records(docs.digests, order.packed(index), docs.places)
        writer.add_piece(tokens.data.cast("B"), lengths, records, task=index, first_doc=next_doc)
        next_doc += int(lengths.size)
        progress.show(writer.documents, writer.position)


def _run_workers(req: PrepareRequest, writer: ShardWriter, progress: Progress, tok: Tokenizer,
                 load_tokenizer: Callable[[str], Tokenizer], tasks: Iterator[Task], order: ReadOrder) -> None:
    """N worker processes, each writing its own piece files; the pieces are added in task order."""
    from .workers import Piece, Workers, piece_path  # start-up: multiprocessing only when there are workers

    workers = Workers(req.workers, out=req.out, dtype=writer.dtype, text_field=req.text_field, tok=tok,
                      load_tokenizer=load_tokenizer, tokenizer=req.tokenizer)
    finished: dict[int, Piece] = {}  # pieces that came back before their turn
    done = sent = writer.start_task  # tasks added to the shards; tasks handed out
    next_doc = writer.start_doc
    more = True
    stop = True
    try:
        while True:
            while more and workers.has_room() and sent - done < WINDOW_PER_WORKER * req.workers:
                task = next(tasks, None)
                if task is None:
                    more = False
                    break
                workers.submit(sent, task)
                order.handed(sent)
                sent += 1
            if done == sent:  # nothing handed out is unfinished, and nothing is left to hand out
                break
            for piece in workers.finished():
                finished[piece.task] = piece
            while done in finished:
                piece = finished.pop(done)
                if piece.error is not None:  # the first bad task in source order, whatever N
                    raise piece.error
                lengths = np.frombuffer(piece.lengths, dtype="<i8")
                records = document_records(np.frombuffer(piece.digests, dtype="<u8"), order.packed(done),
                                           np.frombuffer(piece.places, dtype="<i8"))
                writer.add_piece(piece_path(req.out, done), lengths, records, task=done, first_doc=next_doc)
                next_doc += int(lengths.size)
                done += 1
                progress.show(writer.documents, writer.position)
        stop = False
    finally:
        workers.close(stop=stop)
