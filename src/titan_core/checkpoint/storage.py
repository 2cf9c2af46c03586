"""DCP storage without pickles: raw tensor bytes on save, a JSON index, a reader that unpickles nothing.

DCP's ``FileSystemWriter`` stores each tensor with ``torch.save`` and its index
``.metadata`` with ``pickle``; its reader unpickles both. Here

* ``IndexedWriter`` writes each rank's tensors as raw bytes, one file per rank
  (``__<rank>_0.distcp``), and the coordinator writes ``tensor_index.json``
  instead of ``.metadata`` (DCP's planning, staging and async machinery are kept);
* ``IndexedReader`` rebuilds DCP's ``Metadata`` from that JSON and turns bytes back
  into tensors with ``torch.frombuffer``: no byte read from a checkpoint is ever
  unpickled;
* ``CheckedLoadPlanner`` refuses a tensor whose dtype or shape differs from the
  one being loaded into, naming it, instead of letting ``copy_`` cast silently.

Non-tensor state (LR schedule, data position, optimizer hyper-parameters) never
reaches DCP: ``split_values`` takes it out and it is stored as JSON in the index.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, WriteResult
from torch.futures import Future

from ..errors import CheckpointError
from ..runtime.torch_compat import (
    flatten_state_dict,
    narrow_tensor_by_index,
    set_element,
    storage_info,
    unflatten_state_dict,
)
from .tensor_index import DTYPES, Chunk, TensorIndex, encode_value, write_index
from .verified_read import read_verified

# DCP warns on every single-process save/load; a single process is a supported layout here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


# ---- splitting a state dict into tensors (for DCP) and plain values (for JSON) ----------------


def split_values(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(nested tensor-only state for DCP, flattened non-tensor values, flatten mappings)."""
    flat, mappings = flatten_state_dict(state)
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    values = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return unflatten_state_dict(tensors, mappings), values, mappings


def encode_values(values: dict[str, Any]) -> dict[str, Any]:
    return {key: encode_value(value, key=key) for key, value in sorted(values.items())}


def restore_values(state: dict[str, Any], wanted: dict[str, Any], mappings: dict[str, Any], index: TensorIndex,
                   *, path: Path) -> None:
    """Put the checkpoint's plain values for every key in ``wanted`` into the nested ``state``."""
    for key in sorted(wanted):
        if key not in index.values:
            raise CheckpointError(
                f"checkpoint {path} has no value for {key!r}, which this run's state holds. The checkpoint was "
                f"written by a different training setup; resume from another checkpoint or start fresh with "
                f"--checkpoint.resume=never."
            )
        set_element(state, mappings[key], index.values[key])


# ---- writing --------------------------------------------------------------------------------------


class IndexedWriter(FileSystemWriter):
    """FileSystemWriter writing raw tensor bytes and ``tensor_index.json`` instead of pickles.

    ``values`` (already encoded, merged over ranks) is only used by the coordinator.
    """

    def __init__(self, path: Path, *, values: dict[str, Any], file_rank: int | None = None) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self.values = values
        self.file_rank = file_rank

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        # DCP names a rank's file after its place in the plan; a rank saving alone (``file_rank``: rank R of a
        # rehearsed layout) keeps the name it has in the whole job, ``__R_0.distcp``.
        prefix = plan.storage_data.prefix if self.file_rank is None else f"__{self.file_rank}_"
        name = f"{prefix}0.distcp"
        results: list[WriteResult] = []
        with open(Path(self.path) / name, "wb") as stream:
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:  # split_values keeps these out; never pickle one
                    raise CheckpointError(f"state entry {item.index.fqn!r} is not a tensor; it cannot be saved raw")
                tensor = planner.resolve_data(item)
                assert isinstance(tensor, torch.Tensor)
                data = _plain_bytes(tensor)
                offset = stream.tell()
                stream.write(data.numpy().data)  # the array's own buffer: no copy
                results.append(WriteResult(index=item.index, size_in_bytes=data.numel(),
                                           storage_data=storage_info(name, offset, data.numel())))
            stream.flush()
            os.fsync(stream.fileno())
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        where = {r.index: r.storage_data for rank_results in results for r in rank_results}
        tensors: dict[str, dict[str, Any]] = {}
        for fqn, md in sorted(metadata.state_dict_metadata.items()):
            if not isinstance(md, TensorStorageMetadata):
                raise CheckpointError(f"state entry {fqn!r} is not a tensor; it cannot be saved raw")
            chunks = []
            for chunk in md.chunks:
                info = next(v for k, v in where.items() if k.fqn == fqn and tuple(k.offset or ()) == tuple(chunk.offsets))
                chunks.append({"offsets": list(chunk.offsets), "sizes": list(chunk.sizes),
                               "file": info.relative_path, "offset": info.offset, "length": info.length})
            tensors[fqn] = {"dtype": _DTYPE_NAMES[md.properties.dtype], "size": list(md.size), "chunks": chunks}
        write_index(Path(self.path), tensors, self.values)


def _plain_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's values as a flat uint8 CPU tensor; a subclass (a low-precision training weight) by value."""
    tensor = tensor.detach()
    if type(tensor) is not torch.Tensor:
        plain = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="cpu")
        plain.copy_(tensor)
        tensor = plain
    return tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8)


# ---- reading --------------------------------------------------------------------------------------


class IndexedReader(StorageReader):
    """Reads what ``IndexedWriter`` wrote, from an index already parsed and checked by the caller."""

    def __init__(self, path: Path, index: TensorIndex) -> None:
        super().__init__()
        self.path = Path(path)
        self.index = index
        self.storage: dict[Any, Chunk] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.storage = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata is a format we never write
            raise CheckpointError(f"checkpoint {self.path} uses per-rank metadata, which titan-core does not read")
        metadata = self.index.metadata()
        metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage = dict(metadata.storage_data)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, dict[tuple[int, int], list[Any]]] = {}
        for item in plan.items:
            chunk = self.storage[item.storage_index]
            by_file.setdefault(chunk.file, {}).setdefault((chunk.offset, chunk.length), []).append(item)
        for name, by_span in sorted(by_file.items()):
            # Each file is read once, and its size and CRC-32 are checked on those very bytes
            # (verified_read.py); its tensors are committed only once the whole file matched.
            filled: list[tuple[Any, torch.Tensor]] = []

            def use(offset: int, length: int, data: bytearray, by_span: dict[tuple[int, int], list[Any]] = by_span,
                    filled: list[tuple[Any, torch.Tensor]] = filled) -> None:
                for item in by_span[(offset, length)]:
                    chunk = self.storage[item.storage_index]
                    dtype = self.index.tensors[item.storage_index.fqn].dtype
                    flat = torch.frombuffer(data, dtype=dtype) if length else torch.empty(0, dtype=dtype)
                    source = narrow_tensor_by_index(flat.reshape(chunk.sizes), item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    target.copy_(source)
                    filled.append((item, target))

            if name not in self.index.files:
                raise CheckpointError(f"checkpoint {self.path}: {name} is not listed in its manifest")
            read_verified(self.path, name, self.index.files[name], list(by_span), use)
            for item, target in filled:
                planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True


class CheckedLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that refuses a dtype or shape change instead of casting."""

    def set_up_planner(self, state_dict: dict[str, Any], metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        assert metadata is not None
        for fqn, value in sorted(self.state_dict.items()):
            md = metadata.state_dict_metadata.get(fqn)
            if not isinstance(value, torch.Tensor) or not isinstance(md, TensorStorageMetadata):
                continue
            dtype = value.dtype
            shape = tuple(value.shape)  # a DTensor's shape is its global shape
            if md.properties.dtype != dtype or tuple(md.size) != shape:
                kind = "dtype" if md.properties.dtype != dtype else "shape"
                raise CheckpointError(
                    f"tensor {fqn!r} has {kind} {_describe_tensor(md.properties.dtype, tuple(md.size))} in the "
                    f"checkpoint but {_describe_tensor(dtype, shape)} in this run; titan-core never casts or "
                    f"reshapes on load. Resume with the settings that wrote the checkpoint or start fresh with "
                    f"--checkpoint.resume=never."
                )


def _describe_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"
