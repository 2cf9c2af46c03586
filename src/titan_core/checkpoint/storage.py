"""DCP reading without unpickling arbitrary objects.

DCP's ``.metadata`` is a pickle and its non-tensor entries are read with
``torch.load(weights_only=False)``; a checkpoint folder copied from elsewhere
could therefore run code on load. The reader below unpickles only DCP's own
metadata classes, and the planner reads non-tensor entries with
``weights_only=True`` (plain containers and numbers only).
"""

from __future__ import annotations

import collections
import io
import pathlib
import pickle
import warnings
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.planner import ReadItem

from ..errors import CheckpointError
from .layout import METADATA_FILE

# DCP warns on every single-process save/load; a single process is a supported layout here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
    ("pathlib", "WindowsPath"): pathlib.WindowsPath,
    ("pathlib", "PureWindowsPath"): pathlib.PureWindowsPath,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == dcp_metadata.__name__ and hasattr(dcp_metadata, name):
            return getattr(dcp_metadata, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}: not part of DCP's metadata format")


def read_metadata(folder: pathlib.Path) -> Metadata:
    """Read DCP's ``.metadata`` of ``folder``; damage is a CheckpointError naming the file."""
    path = folder / METADATA_FILE
    try:
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"holds a {type(metadata).__name__}, not DCP Metadata")
    except Exception as exc:  # a truncated pickle raises EOFError, garbage raises anything
        raise CheckpointError(
            f"checkpoint metadata file {path} is unreadable or corrupt ({type(exc).__name__}: {exc}). "
            f"Resume from another step-N folder."
        ) from exc
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata read accepts only DCP's own classes."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata is a format we never write
            raise CheckpointError(f"checkpoint {self.path} uses per-rank metadata, which titan-core does not read")
        metadata = read_metadata(pathlib.Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner reading non-tensor entries with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
