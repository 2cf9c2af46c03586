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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from ..errors import ConfigError


@runtime_checkable
class StateDictAdapter(Protocol):
    """What ``TrainSpec.state_dict_adapter`` provides (see the module docstring)."""

    runtime_fields: tuple[str, ...]

    def model_args_from_hf(self, config: Mapping[str, Any]) -> Any: ...
    def hf_config(self, model_args: Any) -> dict[str, Any]: ...
    def from_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: Any) -> dict[str, torch.Tensor]: ...
    def to_hf(self, state_dict: Mapping[str, torch.Tensor], model_args: Any) -> dict[str, torch.Tensor]: ...


def adapter_of(spec: Any, *, purpose: str) -> StateDictAdapter:
    """The spec's adapter, or a ConfigError saying that ``purpose`` needs one."""
    adapter: StateDictAdapter | None = getattr(spec, "state_dict_adapter", None)
    if adapter is None:
        raise ConfigError(
            f'spec "{spec.name}" has no state_dict_adapter, which {purpose} needs (the Hugging Face format is '
            f"model-specific). Use a spec that provides one, or a titan checkpoint instead."
        )
    return adapter


def hf_key_of(adapter: StateDictAdapter, key: str, shape: tuple[int, ...], dtype: torch.dtype, model_args: Any,
              *, to_hf: bool) -> tuple[str, tuple[int, ...]] | None:
    """The name and shape one tensor gets on the other side, found with a meta tensor (no data read)."""
    fn = adapter.to_hf if to_hf else adapter.from_hf
    out = fn({key: torch.empty(shape, dtype=dtype, device="meta")}, model_args)
    if not out:
        return None
    (name, tensor), = out.items()
    return name, tuple(tensor.shape)
