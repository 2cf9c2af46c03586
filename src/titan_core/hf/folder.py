"""A Hugging Face model folder on disk: ``config.json`` plus one safetensors file or shards with an index.

Everything is read as untrusted input: the index may only name plain files inside the
folder, every shard it names must exist, and tensor names and shapes are read from the
safetensors headers (no tensor data) before anything is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from ..runtime.folder_kinds import HF_WEIGHTS_INDEX, HF_WEIGHTS_SINGLE
from ..runtime.os_errors import not_a_folder
from .rope_fields import check_rope_fields
from .slice_reader import SliceReader, TensorInfo

if TYPE_CHECKING:
    from .slice_reader import SliceReader

SINGLE = HF_WEIGHTS_SINGLE
INDEX = HF_WEIGHTS_INDEX


@dataclass(frozen=True)
class HFFolder:
    path: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]  # Hugging Face name -> where it is and its shape

    def reader(self) -> SliceReader:
        """A reader of row/column slices of this folder's tensors (a context manager)."""

        return SliceReader(self)


def open_hf_folder(path: str | Path, *, what: str) -> HFFolder:
    """Read config.json and the tensor headers of ``path``; ConfigError for anything amiss."""
    from safetensors import safe_open

    path = Path(path)
    fix = "point it at a folder saved by transformers' save_pretrained (config.json + model.safetensors or shards)"
    if not path.is_dir():
        raise ConfigError(f"{what}: {path} {not_a_folder(path)}; {fix}.")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{what}: {path} has no config.json, so it is not a Hugging Face model folder; {fix}.")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    # ValueError, not only JSONDecodeError: a number of over 4,300 digits is refused by int() inside the parser
    # (it ended titan-convert and titan-generate with a traceback)
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{what}: cannot read {path / 'config.json'}: {exc}.") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{what}: {path / 'config.json'} is not a JSON object.")

    check_rope_fields(config, path / "config.json", what=what)
    files = _weight_files(path, what=what, fix=fix)
    tensors: dict[str, TensorInfo] = {}
    for file, expected in files.items():
        try:
            with safe_open(str(path / file), framework="pt") as handle:
                for name in handle.keys():
                    if expected is not None and name not in expected:
                        continue  # the index names another shard for it
                    meta = handle.get_slice(name)
                    dtype = _dtype(meta.get_dtype(), path / file, name, what=what)
                    tensors[name] = TensorInfo(file, tuple(meta.get_shape()), dtype)
        except ConfigError:
            raise
        except Exception as exc:  # safetensors raises its own error types for damaged headers
            raise ConfigError(f"{what}: {path / file} is not a readable safetensors file ({exc}); re-download it.") \
                from None
        absent = sorted((expected or set()) - set(tensors))
        if absent:
            raise ConfigError(f"{what}: {INDEX} places {absent[0]} (and {len(absent) - 1} more) in {file}, "
                              f"which does not hold it; the folder is inconsistent, re-download it.")
    return HFFolder(path, config, tensors)


def _weight_files(path: Path, *, what: str, fix: str) -> dict[str, set[str] | None]:
    """safetensors file -> the names the index assigns to it (None: a single file, all its names)."""
    if (path / INDEX).is_file() and (path / SINGLE).exists():
        # transformers loads model.safetensors first, titan would read the index: two readers of
        # the same folder must not start from different weights, so neither is guessed.
        raise ConfigError(f"{what}: {path} holds both {SINGLE} and {INDEX} (with its shards), so which weights "
                          f"are meant is unclear (transformers would load {SINGLE}); remove the stale one.")
    if (path / INDEX).is_file():
        try:
            weight_map = json.loads((path / INDEX).read_text(encoding="utf-8"))["weight_map"]
            assert isinstance(weight_map, dict)
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AssertionError):  # as config.json
            raise ConfigError(f"{what}: {path / INDEX} is not a safetensors index (no weight_map object).") from None
        by_file: dict[str, set[str] | None] = {}
        for name, file in weight_map.items():
            if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
                raise ConfigError(f"{what}: {INDEX} names {file!r} for {name}: shard names must be plain file "
                                  f"names inside the folder.")
            entry = by_file.setdefault(file, set())
            assert entry is not None
            entry.add(name)
        missing = [f for f in sorted(by_file) if not (path / f).is_file()]
        if missing:
            count = len(by_file[missing[0]] or ())
            raise ConfigError(f"{what}: shard {path / missing[0]} is missing ({INDEX} lists {count} tensors in it"
                              f"{f', and {len(missing) - 1} more shards are missing' if len(missing) > 1 else ''}); "
                              f"the download is incomplete, fetch the missing files again.")
        return by_file
    if (path / SINGLE).is_file():
        return {SINGLE: None}
    raise ConfigError(f"{what}: {path} has config.json but neither {SINGLE} nor {INDEX}; {fix}.")


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _dtype(name: str, file: Path, tensor: str, *, what: str) -> torch.dtype:
    if name not in _DTYPES:
        # A valid safetensors dtype (F8_E4M3 ...) that titan has no tensor type for: not damage.
        raise ConfigError(f"{what}: {file} stores tensor {tensor} as {name}, which titan cannot read (it reads "
                          f"{', '.join(_DTYPES)}); convert the checkpoint to bfloat16 or float32 first "
                          f"(e.g. with transformers' save_pretrained).")
    return _DTYPES[name]
