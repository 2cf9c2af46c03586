"""Stacked tensors (MoE experts) against Hugging Face folders that store one tensor per expert.

A model may keep its experts as one stacked parameter ``[experts, ...]`` while the
published checkpoints hold ``...experts.0.gate_proj.weight``, ``...experts.1...``. The
adapter's tensor maps stay key-wise by working on a *stacked Hugging Face name* (the
per-expert name without its expert index, e.g. ``model.layers.3.mlp.experts.gate_proj.weight``
of shape ``[experts, ...]``), and the core converts at the folder's edge:

* reading, :func:`stack_folder` presents the per-expert tensors of a folder as one
  virtual tensor under the stacked name; a rank that needs some experts (rows of the
  virtual tensor) reads only those experts' tensors, and within them only its box;
* writing, :func:`unstack` splits a stacked tensor back into the per-expert names.

An adapter opts in with two methods (both optional; without them nothing is stacked):

* ``hf_stacked_name(hf_key) -> (stacked_name, index) | None``: this file tensor is entry
  ``index`` of the stacked tensor ``stacked_name``;
* ``hf_expert_name(stacked_name, index) -> str | None``: the file name of entry ``index``
  of a stacked name (None: the name is not stacked).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ..errors import ConfigError
from .folder import HFFolder
from .slice_reader import Box, SliceReader, TensorInfo


@dataclasses.dataclass(frozen=True)
class StackedHFFolder(HFFolder):
    """An :class:`HFFolder` whose per-expert tensors appear as stacked virtual tensors."""

    stacks: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # stacked name -> file names by index
    files: HFFolder | None = None  # the folder as stored (per-expert names), which the reader reads

    def reader(self) -> SliceReader:
        return _StackedReader(self)


class _StackedReader(SliceReader):
    """Reads a stacked name by reading the chosen experts' tensors (rows) and stacking them."""

    def __init__(self, folder: StackedHFFolder) -> None:
        assert folder.files is not None
        super().__init__(folder.files)  # byte ranges come from the tensors as stored
        self.stacked = folder

    def read(self, name: str, rows: torch.Tensor | None = None, box: Box | None = None) -> torch.Tensor:
        pieces = self.stacked.stacks.get(name)
        if pieces is None:
            return super().read(name, rows, box)
        chosen = range(len(pieces)) if rows is None else [int(r) for r in rows.tolist()]
        inner_rows = None if not box else torch.arange(int(box[0][0]), int(box[0][1]))
        inner_box = None if not box else list(box[1:])
        parts = [super(_StackedReader, self).read(pieces[i], inner_rows, inner_box) for i in chosen]
        if parts:
            return torch.stack(parts)
        info = self.stacked.tensors[name]
        return torch.empty((0, *info.shape[1:]), dtype=info.dtype)


def stack_folder(folder: HFFolder, adapter: object, *, what: str) -> HFFolder:
    """``folder`` with the adapter's per-expert tensors grouped into stacked virtual tensors."""
    name_of = getattr(adapter, "hf_stacked_name", None)
    if name_of is None or isinstance(folder, StackedHFFolder):
        return folder
    groups: dict[str, dict[int, str]] = {}
    tensors: dict[str, TensorInfo] = {}
    for key, info in folder.tensors.items():
        found = name_of(key)
        if found is None:
            tensors[key] = info
            continue
        stacked, index = found
        groups.setdefault(stacked, {})[index] = key
    stacks: dict[str, list[str]] = {}
    for stacked, by_index in sorted(groups.items()):
        count = len(by_index)
        # Indexes 0..count-1 with none missing; found without walking up to the largest index a
        # header names (a forged "experts.99999999999" would take that long, and the memory).
        absent = next((i for i in range(count) if i not in by_index), None)
        if absent is not None:
            raise ConfigError(f"{what}: {folder.path} holds {count} expert tensors of {stacked} but not "
                              f"expert {absent}; the folder is incomplete, re-download it.")
        pieces = [by_index[i] for i in range(count)]
        infos = [folder.tensors[p] for p in pieces]
        odd = next((p for p, i in zip(pieces, infos) if (i.shape, i.dtype) != (infos[0].shape, infos[0].dtype)), None)
        if odd is not None:
            raise ConfigError(f"{what}: {folder.path}: {odd} has shape {list(folder.tensors[odd].shape)} "
                              f"({folder.tensors[odd].dtype}) unlike {pieces[0]} ({list(infos[0].shape)}, "
                              f"{infos[0].dtype}); experts of one layer must have one shape.")
        tensors[stacked] = TensorInfo(infos[0].file, (count, *infos[0].shape), infos[0].dtype)
        stacks[stacked] = pieces
    if not stacks:
        return folder
    return StackedHFFolder(folder.path, folder.config, tensors, stacks, folder)


def unstack(adapter: object, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``to_hf``'s output with every stacked tensor split into its per-expert file names."""
    name_of = getattr(adapter, "hf_expert_name", None)
    if name_of is None:
        return dict(tensors)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if tensor.dim() == 0 or name_of(name, 0) is None:
            out[name] = tensor
            continue
        for i in range(tensor.shape[0]):
            out[name_of(name, i)] = tensor[i]
    return out
