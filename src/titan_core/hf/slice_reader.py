"""Reads parts of the tensors of a Hugging Face folder's safetensors files: chosen rows, and a box of the other dims.

A rank of a sharded model reads only the bytes of its own shard: the rows it needs
(in any order, through the adapter's row map) and, within each row, the columns (or
the box of the later dims) its placement gives it. Everything is read with plain
positioned reads into a buffer of the result's size; no memory map, since a mapped
file's touched pages stay resident in the process until it is closed, which would add
up to a whole file per rank.

The safetensors header is untrusted: its length, every tensor's byte range, and that
range's size against the tensor's shape and dtype are checked against the file before
any buffer is allocated, and every row and box asked for is checked against the shape.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ..errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a Hugging Face folder lies: its file, shape and dtype (from the header)."""

    file: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class TensorFolder(Protocol):
    """What the reader needs of a folder (``folder.HFFolder`` is one); a Protocol so this module
    does not import ``folder``, which imports it."""

    @property
    def path(self) -> Path: ...
    @property
    def tensors(self) -> Mapping[str, TensorInfo]: ...


Box = Sequence[tuple[int, int]]  # [start, stop) per tensor dim after the first


class SliceReader:
    """Reads row/box slices of the tensors of one folder (:class:`folder.HFFolder`; a context manager).

    ``bytes_read`` counts the tensor bytes read so far (headers not included), so a test
    or a log line can show that a rank read its shard, not the model.
    """

    def __init__(self, folder: TensorFolder) -> None:
        self.folder = folder
        self.bytes_read = 0
        self._fd: int | None = None
        self._file_name: str | None = None
        self._offsets: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> SliceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._file_name = None

    # ---- opening a file: the header's byte ranges, checked ---------------------------------------
    def _damaged(self, file: str, what: str) -> ConfigError:
        return ConfigError(f"{self.folder.path / file} {what}; the file is damaged, re-download it.")

    def _open(self, file: str) -> None:
        self.__exit__()
        path = self.folder.path / file
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            header_len = int.from_bytes(os.pread(fd, 8, 0), "little") if size >= 8 else 0
            if header_len <= 0 or 8 + header_len > size:
                raise self._damaged(file, "has no valid safetensors header")
            try:
                header = json.loads(os.pread(fd, header_len, 8))
                assert isinstance(header, dict)
            except (ValueError, AssertionError, RecursionError):
                raise self._damaged(file, "has a safetensors header that is not a JSON object") from None
            base = 8 + header_len
            offsets: dict[str, tuple[int, int]] = {}
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                try:
                    begin, end = (int(x) for x in entry["data_offsets"])
                except (KeyError, TypeError, ValueError):
                    raise self._damaged(file, f"gives tensor {name} no valid data_offsets") from None
                if not 0 <= begin <= end <= size - base:
                    raise self._damaged(file, f"places tensor {name} outside the file")
                offsets[name] = (base + begin, base + end)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._file_name, self._offsets = fd, file, offsets

    def _span(self, name: str) -> tuple[int, tuple[int, ...], torch.dtype]:
        """(the file offset of the tensor's first byte, its shape, its dtype), the byte count checked."""
        info = self.folder.tensors[name]
        if self._fd is None or self._file_name != info.file:
            self._open(info.file)
        if name not in self._offsets:
            raise self._damaged(info.file, f"no longer holds tensor {name}")
        begin, end = self._offsets[name]
        nbytes = math.prod(info.shape) * info.dtype.itemsize
        if end - begin != nbytes:
            raise self._damaged(info.file, f"gives tensor {name} {end - begin} bytes, not the {nbytes} its shape "
                                           f"{list(info.shape)} needs")
        return begin, tuple(info.shape), info.dtype

    # ---- reading ---------------------------------------------------------------------------------
    def read(self, name: str, rows: torch.Tensor | None = None, box: Box | None = None) -> torch.Tensor:
        """``tensor[rows]`` restricted to ``box`` in the later dims, reading only those bytes.

        ``rows``: 1-D int64 row indices, any order, repeats allowed (None: every row);
        ``box``: ``(start, stop)`` per dim after the first (None: all). A 0-d tensor is read whole.
        """
        begin, shape, dtype = self._span(name)
        if not shape:
            return self._read_whole(begin, shape, dtype)
        box = [(0, n) for n in shape[1:]] if box is None else [(int(a), int(b)) for a, b in box]
        if len(box) != len(shape) - 1 or any(not 0 <= a <= b <= n for (a, b), n in zip(box, shape[1:])):
            raise ValueError(f"{name}: box {box} does not fit shape {list(shape)}")
        if rows is None:
            wanted, inverse = torch.arange(shape[0]), None
        else:
            if rows.dim() != 1 or rows.dtype != torch.int64:
                raise ValueError(f"{name}: rows must be a 1-D int64 tensor")
            if rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < shape[0]):
                raise ValueError(f"{name}: rows outside [0, {shape[0]})")
            wanted, inverse = torch.unique(rows, sorted=True, return_inverse=True)
            if wanted.numel() == rows.numel() and torch.equal(wanted, rows):
                inverse = None  # already sorted and unique: read straight into place
        out_shape = (wanted.numel(), *(b - a for a, b in box))
        buffer = bytearray(math.prod(out_shape) * dtype.itemsize)
        if buffer:
            self._read_rows(begin, shape, dtype.itemsize, wanted.tolist(), box, memoryview(buffer))
        out = torch.frombuffer(buffer, dtype=dtype) if buffer else torch.empty(0, dtype=dtype)
        out = out.reshape(out_shape)
        return out if inverse is None else out[inverse]

    def _read_whole(self, begin: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        buffer = bytearray(math.prod(shape) * dtype.itemsize)
        self._pread_into(memoryview(buffer), begin)
        return torch.frombuffer(buffer, dtype=dtype).reshape(shape)

    def _read_rows(self, begin: int, shape: tuple[int, ...], itemsize: int, rows: list[int], box: Box,
                   out: memoryview) -> None:
        row_bytes = math.prod(shape[1:]) * itemsize
        segments = _segments(shape[1:], box, itemsize)  # (offset in a row, length) of what one row contributes
        if segments == [(0, row_bytes)]:
            # Whole rows: one read per run of consecutive rows.
            pos, i = 0, 0
            while i < len(rows):
                j = i + 1
                while j < len(rows) and rows[j] == rows[j - 1] + 1:
                    j += 1
                length = (j - i) * row_bytes
                self._pread_into(out[pos:pos + length], begin + rows[i] * row_bytes)
                pos, i = pos + length, j
            return
        pos = 0
        for row in rows:
            for offset, length in segments:
                self._pread_into(out[pos:pos + length], begin + row * row_bytes + offset)
                pos += length

    def _pread_into(self, view: memoryview, offset: int) -> None:
        assert self._fd is not None
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n <= 0:
                raise self._damaged(self._file_name or "?", "ends early")
            done += n
        self.bytes_read += len(view)


def _segments(shape: Sequence[int], box: Box, itemsize: int) -> list[tuple[int, int]]:
    """The contiguous byte ranges ``(offset, length)`` of ``box`` within one row of ``shape`` (row-major).

    Inner dims that the box covers whole merge into one range, so a column block of a
    2-D tensor is one range per row and a full row is a single range.
    """
    if not shape:
        return [(0, itemsize)]
    inner = _segments(shape[1:], box[1:], itemsize)
    stride = math.prod(shape[1:]) * itemsize
    (start, stop) = box[0]
    if stop <= start:
        return []
    if inner == [(0, stride)]:  # the rest of each index is whole: one range for the whole run
        return [(start * stride, (stop - start) * stride)]
    return [(i * stride + off, length) for i in range(start, stop) for off, length in inner]
