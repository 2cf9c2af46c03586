"""What a run trains on, as recorded in its checkpoints: each source's share and a fingerprint of its tokens.

A resume continues the data loader from its saved position (an epoch, a window offset, or a
mixture's rows per source). That position only means something on the same data: on a shard set
swapped for one with as many windows, on changed mixture weights (the deficit rule then serves a
burst of the sources whose share rose) or with a source dropped, the run would train on without a
word. So each checkpoint records, per source, its normalised weight and a fingerprint of the tokens
of its training split, and a resume compares them (checkpoint/identity.py says what changed).

The fingerprint is a BLAKE2b digest: of the token stream itself for data held in memory (the
built-in corpus, files, hub datasets: hashing runs at about 1 GB/s), and of the index's SHA-256s
plus the split's segments for a ``tokens:DIR`` shard set (the shards are never read for it).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

__all__ = ["data_identity", "stream_fingerprint"]


def stream_fingerprint(stream: object) -> str:
    """A 16-hex-digit digest of a split's tokens (see the module's note)."""
    digest = hashlib.blake2b(digest_size=8)
    if isinstance(stream, torch.Tensor):
        digest.update(str(stream.dtype).encode())
        digest.update(stream.detach().contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()
    shard_set = getattr(stream, "shard_set", None)
    index = getattr(shard_set, "index", None)
    if isinstance(index, dict):  # a tokens:DIR split (data/shards.py SplitWindows)
        shards = [entry.get("sha256") for entry in index.get("shards", []) if isinstance(entry, dict)]
        documents = index.get("documents", {})
        digest.update(json.dumps({"dtype": index.get("dtype"), "shards": shards,
                                  "documents": documents.get("sha256") if isinstance(documents, dict) else None},
                                 sort_keys=True).encode())
        for segments in (getattr(stream, "seg_start", None), getattr(stream, "seg_len", None)):
            if segments is not None:
                digest.update(segments.tobytes())
        return digest.hexdigest()
    digest.update(f"{type(stream).__qualname__}:{getattr(stream, 'numel', lambda: 0)()}".encode())
    return digest.hexdigest()


def data_identity(loader: object) -> dict[str, dict[str, Any]] | None:
    """Per source of ``loader`` (a prefetching wrapper is looked through): its data source, normalised weight
    and fingerprint, from the loader's ``data_record()``. None for a loader without one (a spec's own),
    whose data the core cannot describe."""
    inner = getattr(loader, "loader", loader)
    record = getattr(inner, "data_record", None)
    return record() if callable(record) else None
