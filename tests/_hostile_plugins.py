"""In-process plugins that misbehave, for tests/test_hostile_inputs.py (``--import _hostile_plugins``).

Each is the llama3 spec or a tiny converter with one method replaced by one that fails.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from _plugin_base import QuietConverter
from pydantic import BaseModel, model_validator

from titan_core import register_model_converter, register_train_spec
from titan_core.plugin import discovery

_llama = discovery.load_train_spec("llama3")


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("plugin bug on purpose")


class _BadInit(_llama.model_cls):  # type: ignore[misc, name-defined]
    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        raise ValueError(f"cannot initialise {fqn}")


class _ShortOutput(_llama.model_cls):  # type: ignore[misc, name-defined]
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens)[:, :-1]


class _ForwardRaises(_llama.model_cls):  # type: ignore[misc, name-defined]
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        raise IndexError("forward bug on purpose")


class _ConstructorRaises(_llama.model_cls):  # type: ignore[misc, name-defined]
    def __init__(self, args: Any) -> None:
        raise AttributeError("model constructor bug on purpose")


def _returns_none(*args: Any, **kwargs: Any) -> None:
    return None


def _validate_crashes(model_args: Any, **facts: Any) -> None:
    raise AssertionError("validate bug on purpose")


for name, change in {
    "hostile_parallelize": {"parallelize_fn": _boom},
    "hostile_init": {"model_cls": _BadInit},
    "hostile_short_output": {"model_cls": _ShortOutput},
    "hostile_forward": {"model_cls": _ForwardRaises},
    "hostile_model_cls": {"model_cls": _ConstructorRaises},
    "hostile_tokenizer": {"build_tokenizer_fn": _boom},
    "hostile_validate": {"validate_fn": _validate_crashes},
    "hostile_flops": {"flops_per_token_fn": _boom},
    "hostile_loss": {"build_loss_fn": _returns_none},
    "hostile_optimizers": {"build_optimizers_fn": _returns_none},
}.items():
    register_train_spec(dataclasses.replace(_llama, name=name, defaults={}, **change), name)


_Converter = QuietConverter


class _ConvertRaises(_Converter):
    def convert(self, model: torch.nn.Module, fqns: list[str]) -> None:
        raise RuntimeError("convert bug on purpose")


class _SelectRaises(_Converter):
    def select(self, model: torch.nn.Module) -> list[str]:
        raise KeyError("select bug on purpose")


class _InitRaises(_Converter):
    def __init__(self, config: Any, *, parallel_dims: Any, job: Any) -> None:
        raise ZeroDivisionError("init bug on purpose")


class _BadDefaults(_Converter):
    class Config(BaseModel):
        block_size: int = 0

        @model_validator(mode="after")
        def _positive(self) -> _BadDefaults.Config:
            if self.block_size <= 0:
                raise ValueError("block_size must be positive")
            return self


class _HookRaises(_Converter):
    def post_optimizer_hook(self, model_parts: list[torch.nn.Module]) -> None:
        raise OSError("hook bug on purpose")


for name, cls in {"hostile_convert": _ConvertRaises, "hostile_select": _SelectRaises,
                  "hostile_conv_init": _InitRaises, "hostile_defaults": _BadDefaults,
                  "hostile_hook": _HookRaises}.items():
    register_model_converter(name, cls)
