"""Misbehaving plugins and config functions for tests/test_hostile_survey.py (``--import _survey_plugins``).

Each is a tiny converter or the llama3 spec with one method that fails in an unusual way:
a BaseException subclass of its own, SystemExit, MemoryError, RecursionError, or a
return value of the wrong type.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch
from _plugin_base import QuietConverter
from pydantic import BaseModel, field_validator

from titan_core import register_model_converter, register_train_spec
from titan_core.plugin import discovery

_llama = discovery.load_train_spec("llama3")


class OddStop(BaseException):
    """Not an Exception: slips past every ``except Exception``."""


_Converter = QuietConverter


class _ConvertReturnsACopy(_Converter):
    """Written like a functional API (convert returns the converted model) and leaving its input as it was."""

    def convert(self, model: torch.nn.Module, fqns: list[str]) -> torch.nn.Module:  # type: ignore[override]
        import copy

        return copy.deepcopy(model)


class _ConvertReturnsItsInput(_Converter):
    """torchao's convert_to_float8_training style: rewrites in place and also returns the model (accepted)."""

    def convert(self, model: torch.nn.Module, fqns: list[str]) -> torch.nn.Module:  # type: ignore[override]
        model.get_submodule(fqns[0]).register_buffer("marked", torch.zeros(1), persistent=False)
        return model


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


class _ConvertBaseException(_Converter):
    def convert(self, model: torch.nn.Module, fqns: list[str]) -> None:
        raise OddStop("a BaseException of its own")


class _ConvertExits(_Converter):
    def convert(self, model: torch.nn.Module, fqns: list[str]) -> None:
        sys.exit(0)


class _ConvertMemoryError(_Converter):
    def convert(self, model: torch.nn.Module, fqns: list[str]) -> None:
        raise MemoryError("cannot allocate the scales")


class _SelectRecursion(_Converter):
    def select(self, model: torch.nn.Module) -> list[str]:
        return [str(_recurse(0))]


class _SelectReturnsInt(_Converter):
    def select(self, model: torch.nn.Module) -> list[str]:
        return 42  # type: ignore[return-value]


class _SelectReturnsUnknown(_Converter):
    def select(self, model: torch.nn.Module) -> list[str]:
        return ["no.such.module"]


class _SelectReturnsString(_Converter):
    def select(self, model: torch.nn.Module) -> list[str]:
        return "layers.0.attention.wq"  # type: ignore[return-value]


class _CompatibleRaisesBase(_Converter):
    def compatible_with(self, spec: Any) -> None:
        raise OddStop("compatible_with went wrong")


class _ValidatorRaisesRuntime(_Converter):
    class Config(BaseModel):
        size: int = 1

        @field_validator("size")
        @classmethod
        def _check(cls, v: int) -> int:
            raise RuntimeError("validator bug")


for name, cls in {"odd_base": _ConvertBaseException, "odd_exit": _ConvertExits, "odd_memory": _ConvertMemoryError,
                  "odd_recursion": _SelectRecursion, "odd_select_int": _SelectReturnsInt,
                  "odd_select_unknown": _SelectReturnsUnknown, "odd_select_str": _SelectReturnsString,
                  "odd_compatible": _CompatibleRaisesBase, "odd_validator": _ValidatorRaisesRuntime,
                  "odd_returns_copy": _ConvertReturnsACopy, "odd_returns_input": _ConvertReturnsItsInput}.items():
    register_model_converter(name, cls)


def _parallelize_returns_none(model: torch.nn.Module, **kwargs: Any) -> None:
    return None


class _ForwardTuple(_llama.model_cls):  # type: ignore[misc, name-defined]
    def forward(self, tokens: torch.Tensor) -> Any:
        return (super().forward(tokens),)


class _InitBaseException(_llama.model_cls):  # type: ignore[misc, name-defined]
    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        raise OddStop("init went wrong")


for name, change in {
    "odd_parallelize_none": {"parallelize_fn": _parallelize_returns_none},
    "odd_forward_tuple": {"model_cls": _ForwardTuple},
    "odd_init_base": {"model_cls": _InitBaseException},
}.items():
    register_train_spec(dataclasses.replace(_llama, name=name, defaults={}, **change), name)


# ---- config functions -----------------------------------------------------------------------------

def returns_list() -> Any:
    return [("training", {"steps": 2})]


def returns_none() -> Any:
    return None


def returns_section_as_int() -> Any:
    return {"training": 5}


def returns_non_str_keys() -> Any:
    return {"training": {1: 2}}


def raises_memory_error() -> Any:
    raise MemoryError("config too big")


def recurses() -> Any:
    return _recurse(0)


def raises_base_exception() -> Any:
    raise OddStop("config went wrong")


def returns_generator() -> Any:
    return (x for x in range(3))


def returns_self_referencing() -> Any:
    d: dict[str, Any] = {"training": {}}
    d["training"]["steps"] = d
    return d
