"""Hugging Face interop: the state-dict adapter protocol, HF folders, initial_load and the hf
export.

The core never names a model: every name and shape mapping goes through the spec's
``state_dict_adapter`` (:class:`StateDictAdapter`).

May import ``boundary`` and everything below it; ``weights``, ``plan`` and ``train`` use it.
"""

from __future__ import annotations

from ..plugin.spec_factories import StateDictAdapter
from .adapter import adapter_of

__all__ = ["StateDictAdapter", "adapter_of"]
