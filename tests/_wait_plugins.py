"""In-process plugins whose calls never return (``--import _wait_plugins``), for tests/test_unbounded_waits.py.

* converter ``hang_hook``: its ``pre_optimizer_hook`` never returns;
* spec ``hang_forward``: llama3 whose model's forward never returns;
* spec ``hang_parallelize``: llama3 whose ``parallelize_fn`` never returns.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from _plugin_base import QuietConverter

from titan_core import discovery, register_model_converter, register_train_spec

_llama = discovery.load_train_spec("llama3")


def _forever() -> None:
    while True:
        time.sleep(1000)


class _HangHook(QuietConverter):
    def select(self, model: torch.nn.Module) -> list[str]:
        return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)][:1]

    def convert(self, model: torch.nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:  # a change the check can see
            model.get_submodule(fqn).register_forward_hook(lambda *args: None)

    def pre_optimizer_hook(self, model_parts: list[Any]) -> None:
        _forever()


class _HangForward(_llama.model_cls):  # type: ignore[misc, name-defined]
    def forward(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        _forever()
        raise AssertionError  # pragma: no cover


def _hang_parallelize(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    _forever()
    raise AssertionError  # pragma: no cover


register_model_converter("hang_hook", _HangHook)
register_train_spec(dataclasses.replace(_llama, name="hang_forward", defaults={}, model_cls=_HangForward), "hang_forward")
register_train_spec(dataclasses.replace(_llama, name="hang_parallelize", defaults={}, parallelize_fn=_hang_parallelize),
                    "hang_parallelize")
