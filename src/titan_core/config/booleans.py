"""Refuse ``true``/``false`` where a config field wants a number.

pydantic's lax mode reads a boolean as 1 or 0, so ``steps = true`` (or ``--training.steps=true``) would
quietly train one step. The check runs on the merged raw layers, against the job model's fields,
before validation: core and plugin sections alike, nested models and tables of models included.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

from ..errors import ConfigError

__all__ = ["refuse_booleans_for_numbers"]

_NUMBERS = (int, float)


def refuse_booleans_for_numbers(layer: dict[str, Any], model: type[BaseModel], prefix: str = "") -> None:
    """Raise ConfigError naming the first key of ``layer`` whose field takes numbers only and whose value is a boolean."""
    for key, value in layer.items():
        field = model.model_fields.get(key)
        if field is None:
            continue  # unknown keys are pydantic's to report, with their did-you-mean
        where = f"{prefix}{key}"
        if isinstance(value, bool) and _numbers_only(field.annotation):
            raise ConfigError(f"{where} = {str(value).lower()} is a boolean, but {where} takes a number; "
                              f"give one (e.g. {where}={field.default if _is_number(field.default) else 1}).")
        for sub, nested, at in _models_in(field.annotation, value, where):
            refuse_booleans_for_numbers(nested, sub, at)


def _is_number(value: object) -> bool:
    return isinstance(value, _NUMBERS) and not isinstance(value, bool)


def _members(annotation: object) -> tuple[object, ...]:
    """The types of a union (``int | None`` -> int, None), or the annotation itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _numbers_only(annotation: object) -> bool:
    """True for int, float and their unions with None (constraints in ``Annotated`` are looked through)."""
    members = [typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in _members(annotation)]
    kinds = [m for m in members if m is not type(None)]
    return bool(kinds) and all(m in _NUMBERS for m in kinds)


def _models_in(annotation: object, value: object, where: str) -> list[tuple[type[BaseModel], dict[str, Any], str]]:
    """The nested sections of a value, with their key prefix: a model's table, or each entry of a table of models."""
    found: list[tuple[type[BaseModel], dict[str, Any], str]] = []
    if not isinstance(value, dict):
        return found
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            found.append((member, value, f"{where}."))
        elif typing.get_origin(member) is dict and len(typing.get_args(member)) == 2:
            item = typing.get_args(member)[1]
            if isinstance(item, type) and issubclass(item, BaseModel):
                found += [(item, entry, f"{where}.{name}.") for name, entry in value.items() if isinstance(entry, dict)]
    return found
