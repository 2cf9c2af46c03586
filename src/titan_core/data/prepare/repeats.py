"""Documents that repeat an earlier document of the same ``titan-data prepare`` word for word: counted and
named, never dropped (the packed tokens are the sources' documents, repeats included).

A repeat is a document (a row of a ``.jsonl``/``.json``/``.parquet`` file, a whole ``.txt`` file, a text
of ``builtin`` or ``hf:``) whose text equals that of a document before it in packing order, across files
and sources. The worker that tokenizes a document also digests its UTF-8 text (8 bytes of BLAKE2b), so the
parent never reads a text again. The parent keeps, per document, a ``RECORD``: that digest, the input it
came from (its number in the sources' listed files) and its place there (``tasks.read_task``). The records
go to disk beside each shard's document offsets (``writer.py``: ``shard-NNNNN.bin.digests`` until the index
is written), so a resumed prepare counts the documents an earlier run packed as well. Once every shard is
written the digests are sorted: every document whose digest an earlier document has is a repeat.

Limits, on purpose: the count is of identical texts (a document that differs by one space, or only in
case, is not a repeat); two different texts share a 64-bit digest with a chance of about n^2 / 2^65 over n
documents (3e-4 for 100 million), and such a pair would be counted. Memory: 20 bytes per document on disk
while prepare runs, and about 17 per document in memory while the digests are sorted at the end (1.7 GB for
100 million documents).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from hashlib import blake2b
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..doc_stream import json_is_list, lines_before

# One per document, in packing order: the digest of its text, its input's number and its place in that input
# (a .jsonl line's byte offset, a parquet row, a document's number in a .json list or a stream; 0 for a .txt).
RECORD = np.dtype([("digest", "<u8"), ("input", "<u4"), ("place", "<i8")])
SHOWN = 3  # repeats named in the summary line


# A NamedTuple, not a dataclass: defined in ~0.15 ms at import against ~1 ms, and prepare's start-up counts.
class Repeats(NamedTuple):
    documents: int  # documents whose text an earlier document has
    tokens: int  # the tokens they take in the shards, BOS and EOS included
    first: list[tuple[tuple[int, int], tuple[int, int]]]  # the first few, each (repeat, the earlier one): (input, place)


def text_digests(texts: Sequence[str]) -> np.ndarray:
    """8-byte BLAKE2b of each text's UTF-8 (a lone surrogate, which a JSON escape can hold, passes as is)."""
    joined = b"".join(blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8).digest() for t in texts)
    return np.frombuffer(joined, dtype="<u8")


def document_records(digests: np.ndarray, input_number: int, places: np.ndarray) -> np.ndarray:
    """The records of one task's documents (all from input ``input_number``)."""
    records = np.empty(digests.size, dtype=RECORD)
    records["digest"], records["input"], records["place"] = digests, input_number, places
    return records


def find_repeats(digests: np.ndarray, offsets: np.ndarray, record_of: Callable[[int], np.void]) -> Repeats:
    """The repeats among the documents whose digests are ``digests`` (in packing order; ``offsets``: their
    first tokens, then the stream's end, as documents.bin; ``record_of``: a document's record, by number)."""
    ordered = np.sort(digests)
    again = ordered[1:] == ordered[:-1]  # each is a document whose digest an earlier one has
    count = int(np.count_nonzero(again))
    if count == 0:
        return Repeats(0, 0, [])
    repeated = np.unique(ordered[1:][again])
    del ordered, again
    involved = np.flatnonzero(np.isin(digests, repeated))  # every document of a repeated text, in order
    values, first_at = np.unique(digests[involved], return_index=True)
    earliest = np.zeros(involved.size, dtype=bool)
    earliest[first_at] = True
    repeats = involved[~earliest]
    tokens = int((offsets[repeats + 1] - offsets[repeats]).sum())
    originals = involved[first_at[np.searchsorted(values, digests[repeats[:SHOWN]])]]

    def where(doc: int) -> tuple[int, int]:
        record = record_of(doc)
        return int(record["input"]), int(record["place"])

    return Repeats(count, tokens, [(where(int(r)), where(int(o))) for r, o in zip(repeats[:SHOWN], originals)])


def describe_place(source: Path | str, place: int) -> str:
    """Where a document is, in a message: its file and line or row, or its number in a source (``RECORD``)."""
    if not isinstance(source, Path):
        return f"{source} document {place + 1}"
    suffix = source.suffix.lower()
    if suffix == ".txt":
        return str(source)
    if suffix == ".parquet":
        return f"{source} row {place}"  # rows count from 0, as prepare's other messages about rows
    if suffix == ".json" and json_is_list(source):
        return f"{source} document {place + 1}"
    return f"{source} line {lines_before(source, place) + 1}"


def repeats_line(repeats: Repeats, inputs: Sequence[Path | str]) -> str:
    """The one line prepare prints about the repeats it packed."""
    def named(where: tuple[int, int]) -> str:
        number, place = where
        if not 0 <= number < len(inputs) or place < 0:  # a .digests file damaged while prepare ran
            return f"a document whose record is damaged (input {number}, place {place})"
        return describe_place(inputs[number], place)

    shown = "; ".join(f"{named(r)} repeats {named(o)}" for r, o in repeats.first)
    more = repeats.documents - len(repeats.first)
    documents = "document repeats" if repeats.documents == 1 else "documents repeat"
    return (f"prepare: {repeats.documents:,} {documents} an earlier document word for word ({repeats.tokens:,} tokens), "
            f"packed again as the sources hold them: {shown}{f'; and {more:,} more' if more else ''} "
            "(index.json: repeated_documents)")
