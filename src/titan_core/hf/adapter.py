"""The state-dict adapter protocol: how a TrainSpec maps its model to the Hugging Face format.

The core never knows a model's key names. ``initial_load`` from a Hugging Face folder,
``--checkpoint.export_format=hf`` and ``titan-convert`` all go through the four methods
of the spec's ``state_dict_adapter``:

* ``model_args_from_hf(config)``: the spec's model args for a ``config.json`` dict;
  raises ``ConfigError`` naming each field it cannot express (another ``model_type``,
  biases, an unsupported RoPE scaling ...);
* ``hf_config(model_args)``: the ``config.json`` dict for those args (the core adds the
  token ids and dtype);
* ``from_hf(state_dict, model_args)`` / ``to_hf(state_dict, model_args)``: rename and
  transform tensors.

Two rules make sharded, bounded-memory loading possible:

* the tensor maps are **key-wise**: each output tensor comes from exactly one input
  tensor of the same number of elements, so the core may call them with a one-entry
  dict, and with ``meta`` tensors to learn a name and shape before reading any data;
* **tied weights** are the model's business: ``to_hf`` may leave out an alias (a tied
  ``lm_head.weight``) and ``from_hf`` may return no tensor for it; the core then fills
  the alias from its source (the model declares ties with ``tied_weights()``).

``runtime_fields`` names the model-args fields that do not change the weights' shapes or
values (the RoPE table's length, the attention kernel): a run may set them freely when
the shape comes from ``config.json``; any other field it sets must agree with the file.

One optional method lets each rank of a sharded model read only its own slice of each
tensor from the safetensors files (see :func:`row_map`):

* ``from_hf_rows(hf_key, hf_shape, model_args)``: the row map of ``from_hf`` for that
  key, when the native tensor is a row gather of the Hugging Face one:
  ``from_hf({hf_key: t})[native_key]`` equals ``t[rows]`` (every later dim unchanged)
  for the 1-D int64 tensor ``rows`` it returns; ``None`` when the rows stay in order (a
  rename). It raises ``NotImplementedError`` for a key whose map is something else (a
  transpose, a split): that tensor is then read whole.

An adapter without ``from_hf_rows`` still works: each rank then reads every tensor its
model parts hold whole, one at a time, and keeps its shard (peak: shard + one tensor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..boundary.plugin_boundary import CheckedAdapter
from ..errors import ConfigError, PluginError
from ..plugin.spec_factories import StateDictAdapter

if TYPE_CHECKING:
    from ..plugin.protocols import TrainSpec


def adapter_of(spec: TrainSpec, *, purpose: str) -> CheckedAdapter:
    """The spec's adapter, every call guarded (plugin_boundary.py), or a ConfigError saying that
    ``purpose`` needs one."""
    adapter: StateDictAdapter | None = getattr(spec, "state_dict_adapter", None)
    if adapter is None:
        raise ConfigError(
            f'spec "{spec.name}" has no state_dict_adapter, which {purpose} needs (the Hugging Face format is '
            f"model-specific). Use a spec that provides one, or a titan checkpoint instead."
        )
    return CheckedAdapter(spec.name, adapter)


def hf_key_of(adapter: StateDictAdapter, key: str, shape: tuple[int, ...], dtype: torch.dtype, model_args: object,
              *, to_hf: bool) -> tuple[str, tuple[int, ...]] | None:
    """The name and shape one tensor gets on the other side, found with a meta tensor (no data read)."""
    fn = adapter.to_hf if to_hf else adapter.from_hf
    out = fn({key: torch.empty(shape, dtype=dtype, device="meta")}, model_args)
    if not out:
        return None
    (name, tensor), = out.items()
    return name, tuple(tensor.shape)


def row_map(adapter: StateDictAdapter, hf_key: str, hf_shape: tuple[int, ...], native_shape: tuple[int, ...],
            model_args: object) -> torch.Tensor | None:
    """Native row i of ``hf_key``'s tensor is Hugging Face row ``map[i]``; None: read the tensor whole.

    None when the adapter has no ``from_hf_rows``, raises ``NotImplementedError`` for this
    key, or the tensor has no rows (0-d). A map that cannot be right (wrong length, rows
    outside the tensor, other dims changed) is the adapter's bug: a PluginError.
    """

    fn = getattr(adapter, "from_hf_rows", None)
    if fn is None or not hf_shape or len(native_shape) != len(hf_shape):
        return None
    try:
        rows = fn(hf_key, tuple(hf_shape), model_args)
    except NotImplementedError:
        return None
    if rows is None:
        rows = torch.arange(hf_shape[0]) if tuple(native_shape) == tuple(hf_shape) else None
        if rows is None:
            raise PluginError(f"{type(getattr(adapter, 'inner', adapter)).__name__}.from_hf_rows({hf_key!r}) says the rows stay in order, but "
                              f"from_hf changes the shape {list(hf_shape)} to {list(native_shape)}")
        return rows
    ok = (isinstance(rows, torch.Tensor) and rows.dim() == 1 and rows.dtype == torch.int64
          and rows.numel() == native_shape[0] and tuple(native_shape[1:]) == tuple(hf_shape[1:])
          and (rows.numel() == 0 or (int(rows.min()) >= 0 and int(rows.max()) < hf_shape[0])))
    if not ok:
        raise PluginError(f"{type(getattr(adapter, 'inner', adapter)).__name__}.from_hf_rows({hf_key!r}) returned no valid row map for a "
                          f"{list(hf_shape)} tensor that from_hf turns into {list(native_shape)} (a 1-D int64 "
                          f"tensor of {native_shape[0]} rows in [0, {hf_shape[0]}) is needed)")
    assert isinstance(rows, torch.Tensor)  # checked by ok above; this tells a type checker
    return rows
