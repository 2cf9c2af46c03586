"""The work of ``titan-data prepare``, cut into tasks that do not depend on the number of workers.

A task names a piece of the sources by where it lies: a byte range of whole lines of a
``.jsonl`` file, a row group of a ``.parquet`` file, a ``.txt`` file. A worker reads, parses
and tokenizes it (``read_task``, then ``encode_documents``: every document as ``[BOS] doc [EOS]``) and
writes the tokens to a piece file of its own (``workers.py``). Only what cannot be named by place travels
as text, through a JSON file (``spilled_texts``): a ``.json`` list, the built-in corpus and
``hf:`` streams.

The cut depends on the sources alone (``TASK_BYTES``), so the documents of task ``k`` are the
same for any N; the parent writes results in task order, and a resume restarts at the task
that holds the first unfinished document (``prepare.json`` records it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ...errors import TitanError
from ..corpus import builtin_documents
from ..deadline import bounded_rows
from ..doc_stream import (
    hub_rows,
    json_is_list,
    json_lines,
    json_list,
    line_ranges,
    parquet_group,
    parquet_row_groups,
)
from ..sources import HF_PREFIX, _read_file, source_files
from .repeats import text_digests

if TYPE_CHECKING:  # its module imports torch; prepare never needs it at run time
    from ...plugin.spec_factories import Tokenizer

TASK_BYTES = 1 << 18  # about this much text per task: small enough that N workers end together


# A NamedTuple, not a dataclass: defined in ~0.15 ms at import against ~1 ms, and prepare's start-up counts.
class Task(NamedTuple):
    """One piece of the sources (``kind``: lines, parquet, txt or texts; texts-file on its way to a worker)."""

    kind: str
    path: str = ""
    start: int = 0  # lines: first byte; parquet: row group; texts: its first text's number in the source
    end: int = 0  # lines: end byte; parquet: the group's first row in the file
    texts: tuple[str, ...] = ()


def plan_tasks(sources: list[str], *, text_field: str, hf_split: str, hf_timeout_s: float = 60.0,
               files: Sequence[list[Path] | None] | None = None, skip: frozenset[int] = frozenset(),
               opening: Callable[[int], None] = lambda number: None) -> Iterator[Task]:
    """Every task of ``sources``, in source order (local sources were checked by the caller). ``files``: each
    source's files as the caller listed (and hashed) them, so what is packed is what is recorded; ``skip``: the
    input numbers of the duplicates left out (provenance.py: by number, not path, since a file listed twice is
    read where it first comes); ``opening``: told each input's number (the sources' files and the
    builtin and hf: sources, counted in order, skipped files too) before anything of it is read."""
    number = 0
    for index, source in enumerate(sources):
        if source == "builtin":
            opening(number)
            yield from _text_tasks(builtin_documents())
            number += 1
        elif source.startswith(HF_PREFIX):
            opening(number)
            # Every network read is bounded: a hub or proxy that accepts and never answers stops prepare, named.
            rows = hub_rows(source[len(HF_PREFIX):], text_field=text_field, split=hf_split)
            yield from _text_tasks(bounded_rows(rows, seconds=hf_timeout_s, source=source, flag="--hf-timeout"))
            number += 1
        else:
            listed = files[index] if files is not None else None
            for path in listed if listed is not None else source_files(source):
                if number not in skip:
                    opening(number)
                    yield from _file_tasks(path, text_field)
                number += 1


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
    chars = first = 0
    for text in texts:
        chunk.append(text)
        chars += len(text)
        if chars >= TASK_BYTES:
            yield Task("texts", start=first, texts=tuple(chunk))
            first += len(chunk)
            chunk, chars = [], 0
    if chunk:
        yield Task("texts", start=first, texts=tuple(chunk))


# A NamedTuple, not a dataclass: defined in ~0.15 ms at import against ~1 ms, and prepare's start-up counts.
class TaskDocuments(NamedTuple):
    """A task's documents: their texts, each one's place in its input and its digest (``repeats.RECORD``)."""

    texts: list[str]
    places: np.ndarray  # int64
    digests: np.ndarray  # uint64


def read_task(task: Task, text_field: str) -> TaskDocuments:
    """The task's documents, read and parsed (a bad row: ConfigError naming it), with their places and digests."""
    placed = list(_placed_texts(task, text_field))
    texts = [text for _, text in placed]
    places = np.fromiter((place for place, _ in placed), dtype="<i8", count=len(placed))
    return TaskDocuments(texts, places, text_digests(texts))


def _placed_texts(task: Task, text_field: str) -> Iterable[tuple[int, str]]:
    path = Path(task.path)
    if task.kind == "lines":
        return json_lines(path, task.start, task.end, text_field)
    if task.kind == "parquet":
        return parquet_group(path, task.start, task.end, text_field)
    if task.kind == "txt":
        return ((0, text) for text in _read_file(path, text_field=text_field))
    return enumerate(task.texts, start=task.start)


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
