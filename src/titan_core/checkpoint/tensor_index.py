"""``tensor_index.json``: our own, pickle-free index of a checkpoint's tensors and values.

DCP's own index (``.metadata``) is a pickle, and DCP stores each tensor and every
non-tensor value with ``torch.save``; reading either means unpickling bytes from
disk, so a crafted checkpoint could run code. titan-core therefore writes

* every tensor as its raw bytes (see ``storage.py``), and
* this JSON file, which DCP's ``Metadata`` is rebuilt from at load time::

    {"format": 1,
     "tensors": {"model.w": {"dtype": "float32", "size": [4, 6],
                             "chunks": [{"offsets": [0, 0], "sizes": [2, 6],
                                         "file": "__0_0.distcp", "offset": 0, "length": 48}, ...]}},
     "values": {"lr_scheduler.last_epoch": 3, "optimizer.param_groups.w.betas": {"tuple": [0.9, 0.95]}}}

Parsing checks every number before anything is allocated: a chunk lies inside its
tensor, the chunks' element count equals the tensor's, each chunk's byte length is
its element count times the dtype's size, and every byte range lies inside a file
the manifest lists, with the manifest's size.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ..errors import CheckpointError
from .json_strict import unique_keys

INDEX_FILE = "tensor_index.json"
INDEX_FORMAT = 1
MAX_INDEX_BYTES = 256 << 20  # far above any real index; bounds what a crafted one makes us parse
_MAX_DIMS = 16

# Only plain numeric dtypes: anything else in an index is refused, never looked up by name.
DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    )
}
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def is_plain_name(name: object) -> bool:
    """A file name without any folder part: no ``/``, no ``..``, not absolute, not hidden."""
    return isinstance(name, str) and bool(_PLAIN_NAME.match(name)) and ".." not in name and len(name) <= 255


@dataclass(frozen=True)
class Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    size: tuple[int, ...]
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class TensorIndex:
    tensors: dict[str, TensorEntry]
    values: dict[str, Any]  # flattened state-dict key -> decoded plain value
    # The manifest's (size, CRC-32) of every file: readers check the bytes they use against it.
    files: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def metadata(self) -> Metadata:
        """DCP's ``Metadata`` for these tensors (the storage data is keyed like DCP's own)."""
        state: dict[str, Any] = {}
        storage: dict[MetadataIndex, Chunk] = {}
        for fqn, entry in self.tensors.items():
            chunks = [ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes)) for c in entry.chunks]
            state[fqn] = TensorStorageMetadata(TensorProperties(dtype=entry.dtype), torch.Size(entry.size), chunks)
            for c in entry.chunks:
                storage[MetadataIndex(fqn, torch.Size(c.offsets))] = c
        return Metadata(state_dict_metadata=state, storage_data=storage)


# ---- values: plain data as tagged JSON (no pickles) -------------------------------------


def encode_value(value: object, *, key: str) -> Any:
    """Plain Python data as JSON; tuples, non-finite floats and dicts are tagged so they round-trip."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v, key=key) for v in value]}
    if isinstance(value, list):
        return [encode_value(v, key=key) for v in value]
    if isinstance(value, dict) and all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
        return {"dict": [[k, encode_value(v, key=key)] for k, v in value.items()]}
    raise CheckpointError(
        f"cannot save the state entry {key!r}: a {type(value).__name__} is neither a tensor nor plain data "
        f"(None, bool, int, float, str, list, tuple, dict). Stateful objects must return plain state dicts."
    )


def decode_value(data: object, *, key: str) -> Any:
    """Inverse of ``encode_value``; any other shape is a CheckpointError."""
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, list):
        return [decode_value(v, key=key) for v in data]
    if isinstance(data, dict) and len(data) == 1:
        (tag, inner), = data.items()
        if tag == "float" and inner in ("nan", "inf", "-inf"):
            return float(inner)
        if tag == "tuple" and isinstance(inner, list):
            return tuple(decode_value(v, key=key) for v in inner)
        if tag == "dict" and isinstance(inner, list):
            out: dict[Any, Any] = {}
            for pair in inner:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (str, int))
                        and not isinstance(pair[0], bool)):
                    break
                out[pair[0]] = decode_value(pair[1], key=key)
            else:
                return out
    raise ValueError(f"value of {key!r} is not in titan-core's value encoding")


# ---- writing ------------------------------------------------------------------------------------


def write_index(folder: Path, tensors: dict[str, dict[str, Any]], values: dict[str, Any]) -> None:
    """Write ``tensor_index.json`` (already JSON-ready parts) atomically and durably."""
    payload = {"format": INDEX_FORMAT, "tensors": tensors, "values": values}
    tmp = folder / f".{INDEX_FILE}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, allow_nan=False, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / INDEX_FILE)


# ---- reading ------------------------------------------------------------------------------------


def read_index(folder: Path, digests: dict[str, tuple[int, int]]) -> TensorIndex:
    """Parse and check the index of ``folder``; ``digests`` is the manifest: file -> (size, CRC-32).

    The bytes parsed are the bytes checked against the manifest (read once, from one open file).
    """
    path = folder / INDEX_FILE
    files = {name: size for name, (size, _) in digests.items()}
    try:
        if INDEX_FILE not in files:
            raise ValueError("the manifest does not list it")
        if files[INDEX_FILE] > MAX_INDEX_BYTES:
            raise ValueError(f"it is {files[INDEX_FILE]} bytes, more than the {MAX_INDEX_BYTES} an index may have")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_INDEX_BYTES + 1)
        if (len(raw), zlib.crc32(raw)) != digests[INDEX_FILE]:
            raise ValueError("its bytes differ from the size and CRC-32 its manifest records (it was replaced "
                             "or damaged after the checkpoint was verified)")
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant,
                          object_pairs_hook=unique_keys)
        if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
            raise ValueError(f"unknown format {data.get('format') if isinstance(data, dict) else None!r} "
                             f"(this titan-core reads {INDEX_FORMAT})")
        tensors_raw, values_raw = data.get("tensors"), data.get("values")
        if not isinstance(tensors_raw, dict) or not isinstance(values_raw, dict):
            raise ValueError('"tensors" and "values" must be JSON objects')
        tensors = {str(fqn): _tensor_entry(str(fqn), raw_entry, files) for fqn, raw_entry in tensors_raw.items()}
        values = {str(k): decode_value(v, key=str(k)) for k, v in values_raw.items()}
        clash = sorted(set(tensors) & set(values))
        if clash:
            raise ValueError(f"{clash[0]!r} is listed both as a tensor and as a value")
    except (OSError, UnicodeDecodeError, ValueError, TypeError, RecursionError) as exc:
        raise CheckpointError(
            f"checkpoint tensor index {path} is unreadable, corrupt or inconsistent ({type(exc).__name__}: {exc}). "
            f"The checkpoint cannot be trusted; resume from another step-N folder."
        ) from exc
    return TensorIndex(tensors, values, dict(digests))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _ints(value: object, *, what: str, fqn: str) -> tuple[int, ...]:
    if not (isinstance(value, list) and len(value) <= _MAX_DIMS
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise ValueError(f"tensor {fqn!r}: {what} must be a list of at most {_MAX_DIMS} non-negative integers")
    return tuple(value)


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_entry(fqn: str, raw: object, files: dict[str, int]) -> TensorEntry:
    if not isinstance(raw, dict) or not isinstance(raw.get("chunks"), list) or not raw["chunks"]:
        raise ValueError(f"tensor {fqn!r}: an entry needs dtype, size and a non-empty list of chunks")
    dtype_name = raw.get("dtype")
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise ValueError(f"tensor {fqn!r}: dtype {raw.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    size = _ints(raw.get("size"), what="size", fqn=fqn)
    itemsize = torch.empty((), dtype=dtype).element_size()
    chunks: list[Chunk] = []
    covered = 0
    for c in raw["chunks"]:
        if not isinstance(c, dict):
            raise ValueError(f"tensor {fqn!r}: a chunk must be a JSON object")
        offsets = _ints(c.get("offsets"), what="chunk offsets", fqn=fqn)
        sizes = _ints(c.get("sizes"), what="chunk sizes", fqn=fqn)
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise ValueError(f"tensor {fqn!r}: a chunk has {len(sizes)} dimensions but the tensor {len(size)}")
        if any(o + s > d for o, s, d in zip(offsets, sizes, size)):
            raise ValueError(f"tensor {fqn!r}: chunk at {list(offsets)} of size {list(sizes)} lies outside {list(size)}")
        name, offset, length = c.get("file"), c.get("offset"), c.get("length")
        if not is_plain_name(name):
            raise ValueError(f"tensor {fqn!r}: file {name!r} is not a plain file name inside the checkpoint folder")
        if name not in files:
            raise ValueError(f"tensor {fqn!r}: file {name!r} is not listed in the checkpoint's manifest")
        if not (_is_count(offset) and _is_count(length)):
            raise ValueError(f"tensor {fqn!r}: offset and length must be non-negative integers")
        count = math.prod(sizes)
        if length != count * itemsize:
            raise ValueError(f"tensor {fqn!r}: a chunk of {count} {raw['dtype']} elements declares {length} bytes, "
                             f"not {count * itemsize}")
        if offset + length > files[name]:
            raise ValueError(f"tensor {fqn!r}: bytes {offset}..{offset + length} lie beyond the end of {name} "
                             f"({files[name]} bytes)")
        covered += count
        chunks.append(Chunk(offsets, sizes, name, offset, length))
    if covered != math.prod(size):
        raise ValueError(f"tensor {fqn!r}: its chunks hold {covered} elements but its size {list(size)} "
                         f"has {math.prod(size)}")
    return TensorEntry(dtype, size, tuple(chunks))
