"""Tokenize documents into one packed stream, split off validation, and cache per process.

Each document becomes ``[BOS] tokens [EOS]`` (the usual pre-training convention:
the model sees where every document starts and ends), and the documents are
concatenated in source order. Windows cut from this stream may span a document
boundary; attention is not masked at boundaries (standard packed pre-training)
unless ``data.document_masking`` is on (``documents.py`` splits windows after each EOS).

Validation split: document ``i`` (0-based, in source order) is held out when
``floor((i + 1) * f) > floor(i * f)`` for ``f = val_fraction``, i.e. every
``1/f``-th document (documents 99, 199, ... for 0.01). The choice depends only on
the position, so it is the same on every rank and every run, and the two splits
never share a document.

Tokenizing the built-in corpus (about 4 MB) takes about half a second on one
CPU core, so the cache is in memory only: one entry per (source, file sizes and
mtimes, text field, tokenizer), shared by the train and validation loaders.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..plugin.spec_factories import BatchEncoder, Fingerprinted, Tokenizer
from ..runtime.cpu_allocator import release_freed_memory
from .loader import WindowSource
from .sources import HF_PREFIX, read_documents, source_files
from .token_ids import check_tokenizer_ids

_CACHE_ENTRIES = 4
_cache: OrderedDict[Hashable, tuple[Any, PackedDocuments]] = OrderedDict()


@dataclass(frozen=True)
class PackedDocuments:
    """All documents of a source, tokenized: doc ``i`` is ``tokens[offsets[i]:offsets[i+1]]``."""

    tokens: torch.Tensor  # int32, 1-D, BOS/EOS included
    offsets: torch.Tensor  # int64, num_docs + 1

    @property
    def num_docs(self) -> int:
        return self.offsets.numel() - 1


def is_validation_doc(index: int, val_fraction: float) -> bool:
    """Whether document ``index`` belongs to the validation split."""
    return math.floor((index + 1) * val_fraction) > math.floor(index * val_fraction)


#: text per tokenizer call while packing: what a tokenizer holds per document (a Hugging Face
#: ``Encoding`` keeps tokens, offsets and masks beside the ids) then stays this small whatever the file
CHUNK_CHARS = 1 << 20


def _chunks(docs: list[str], chunk_docs: int, chunk_chars: int) -> list[list[str]]:
    """``docs`` in order, cut into runs of at most ``chunk_docs`` documents and (a longer document
    alone excepted) ``chunk_chars`` characters."""
    chunks: list[list[str]] = []
    current: list[str] = []
    size = 0
    for doc in docs:
        if current and (len(current) >= chunk_docs or size + len(doc) > chunk_chars):
            chunks.append(current)
            current, size = [], 0
        current.append(doc)
        size += len(doc)
    if current:
        chunks.append(current)
    return chunks


def pack_documents(docs: list[str], tokenizer: Tokenizer, *, chunk_docs: int = 1024,
                   chunk_chars: int = CHUNK_CHARS) -> PackedDocuments:
    """Tokenize ``docs`` as ``[BOS] doc [EOS]`` each and concatenate them.

    Documents are encoded at most ``chunk_docs`` and about ``chunk_chars`` characters at a time,
    and each chunk is turned into an int32 array at once, so neither Python lists of ints nor the
    tokenizer's own per-document objects ever hold more than one chunk. What the tokenizer freed
    is handed back to the system at the end (``release_freed_memory``): the data path's memory
    is then the packed ids, whatever the file's size or the tokenizer.
    """
    encode_batch = tokenizer.encode_batch if isinstance(tokenizer, BatchEncoder) else None
    threads = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    for chunk in _chunks(docs, chunk_docs, chunk_chars):
        bodies = encode_batch(chunk, num_threads=threads) if encode_batch is not None else [tokenizer.encode(d) for d in chunk]
        sizes = [len(b) + 2 for b in bodies]
        flat = np.fromiter(itertools.chain.from_iterable([bos, *b, eos] for b in bodies), dtype=np.int32, count=sum(sizes))
        pieces.append(flat)
        lengths.extend(sizes)
    offsets = torch.zeros(len(docs) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0, out=offsets[1:])
    tokens = torch.from_numpy(np.concatenate(pieces)) if pieces else torch.zeros(0, dtype=torch.int32)

    del pieces
    release_freed_memory()
    check_tokenizer_ids(tokens, tokenizer)
    return PackedDocuments(tokens=tokens, offsets=offsets)


def split_stream(packed: PackedDocuments, *, split: str, val_fraction: float) -> tuple[torch.Tensor, int]:
    """The token stream of one split and its number of documents."""
    want_val = split == "validation"
    keep = [i for i in range(packed.num_docs) if is_validation_doc(i, val_fraction) == want_val]
    if len(keep) == packed.num_docs:
        return packed.tokens, len(keep)
    parts = [packed.tokens[packed.offsets[i] : packed.offsets[i + 1]] for i in keep]
    stream = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32)
    return stream, len(keep)


def _source_key(source: str, text_field: str, hf_split: str) -> Hashable:
    if source == "builtin":
        return ("builtin",)
    if source.startswith(HF_PREFIX):
        return ("hf", source, hf_split, text_field)
    # Size and mtime in the key: a file rewritten in the same process is read again.
    files = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in source_files(source))
    return ("files", str(Path(source).expanduser().resolve()), files, text_field)


def tokenized_source(
    source: str, tokenizer: Tokenizer, *, text_field: str, hf_split: str, allow_download: bool
) -> PackedDocuments:
    """``source`` read and packed with ``tokenizer``, cached per process."""
    tok_key: Hashable = (tokenizer.fingerprint if isinstance(tokenizer, Fingerprinted) else None) \
        or ("object", id(tokenizer))
    key = (_source_key(source, text_field, hf_split), tok_key)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit[1]
    docs = read_documents(source, text_field=text_field, hf_split=hf_split, allow_download=allow_download)
    packed = pack_documents(docs, tokenizer)
    # The tokenizer object is kept alive with its entry so an id() key cannot be reused.
    _cache[key] = (tokenizer, packed)
    while len(_cache) > _CACHE_ENTRIES:
        _cache.popitem(last=False)
    return packed


def clear_cache() -> None:
    """Forget every cached token stream (tests use it to measure cold loads)."""
    _cache.clear()


def check_split(stream: torch.Tensor | WindowSource, *, split: str, source: str, num_docs: int, val_fraction: float, window: int, global_batch: int) -> None:
    """ConfigError when a split cannot fill one global batch of windows."""
    need = window * global_batch
    if stream.numel() >= need:
        return
    if split == "validation" and num_docs == 0:
        raise ConfigError(
            f'data.source "{source}": the validation split is empty (data.val_fraction={val_fraction} selects no '
            "document; every round(1/val_fraction)-th document is held out); raise data.val_fraction or add documents."
        )
    raise ConfigError(
        f'data.source "{source}": the {split} split has {stream.numel()} tokens in {num_docs} documents, but one '
        f"global batch needs {need} ({global_batch} sequences x (seq_len + 1 = {window}) tokens); "
        "use more data, a smaller training.seq_len or training.local_batch_size"
        + (", or a larger data.val_fraction." if split == "validation" else ".")
    )
