"""In-process plugins for tests/test_hardening_second_pass.py (``--import _hardening_plugins``).

* converter ``hang_convert``: ``convert()`` never returns (it sleeps forever);
* converter ``optimizer`` and spec ``training``: names of core config sections;
* spec ``no_layers``: llama3's model under a spec without ``parallelize_fn`` whose blocks are not
  where the core's default parallelize_fn looks (refused naming the spec and ``blocks_attr=``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from _plugin_base import QuietConverter

from titan_core import register_model_converter, register_train_spec
from titan_core.plugin import discovery

_llama = discovery.load_train_spec("llama3")


class _Converter(QuietConverter):
    def select(self, model: torch.nn.Module) -> list[str]:
        return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)][:1]


class _HangConvert(_Converter):
    def convert(self, model: torch.nn.Module, fqns: list[str]) -> None:
        while True:
            time.sleep(1000)


register_model_converter("hang_convert", _HangConvert)
register_model_converter("optimizer", _Converter)
register_train_spec(dataclasses.replace(_llama, name="training", defaults={}), "training")


class _NoLayers(_llama.model_cls):  # type: ignore[misc, name-defined]
    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.blocks = self.layers  # the same modules, under another name: "layers" is no module container now
        del self.layers
        self.layers = 3  # type: ignore[assignment]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # pragma: no cover (never reached)
        raise AssertionError


register_train_spec(dataclasses.replace(_llama, name="no_layers", defaults={}, parallelize_fn=None,
                                        model_cls=_NoLayers), "no_layers")
