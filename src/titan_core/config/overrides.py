"""``--section.key=value`` flags: parsed by the type of the field they set."""

from __future__ import annotations

import sys
from typing import Any, cast, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import ConfigError
from .finite import parse_toml_float

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def parse_override_args(args: list[str]) -> list[tuple[str, str]]:
    """``["--a.b=1", "--c.d", "2"]`` -> ``[("a.b", "1"), ("c.d", "2")]``."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError(
                f"unrecognised argument {arg!r}. Config values are set as --section.key=value "
                f"(e.g. --training.steps=10); see titan-train --help."
            )
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError(f"--{key} needs a value: write --{key}=VALUE.")
            value = args[i + 1]
            i += 1
        pairs.append((key, value))
        i += 1
    return pairs


def _toml_scalar(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}", parse_float=parse_toml_float)["v"]
    except tomllib.TOMLDecodeError:
        return text


def typed_value(annotation: object, text: str) -> Any:
    """The first reading of ``text`` that the field's type accepts: TOML, raw string, comma list."""
    candidates: list[Any] = [_toml_scalar(text), text]
    if text == "":
        candidates.append([])
    else:
        candidates.append([_toml_scalar(part.strip()) for part in text.split(",")])
        candidates.append([part.strip() for part in text.split(",")])
    adapter: TypeAdapter[Any] = TypeAdapter(cast(Any, annotation))  # a field annotation: any type form
    well_typed = None  # the right shape but a value out of range (betas=0.9,1.5): report that, not "not a tuple"
    for candidate in candidates:
        try:
            adapter.validate_python(candidate)
            return candidate
        except ValidationError as exc:
            kinds = [e["type"] for e in exc.errors()]
            if well_typed is None and not any(k.endswith(("_type", "_parsing")) for k in kinds):
                well_typed = candidate
    # let full validation report the error with its location
    return well_typed if well_typed is not None else candidates[0]


def _nested_annotation(model: type[BaseModel] | None, keys: list[str]) -> Any:
    """The type a dotted key path sets (``mix.web.weight`` -> MixSource.weight's), None when unknown."""
    annotation: Any = model
    for key in keys:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(key)
            annotation = field.annotation if field is not None else None
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        else:
            return None
    return annotation


def overrides_layer(pairs: list[tuple[str, str]], sections: dict[str, type[BaseModel]]) -> dict[str, dict[str, Any]]:
    """Nested dict of typed values; unknown sections/keys are left for the validator to name.

    A longer key (``--data.mix.web.weight=0.7``) sets a value inside a table of the section."""
    layer: dict[str, dict[str, Any]] = {}
    for dotted, text in pairs:
        section, *keys = dotted.split(".")
        annotation = _nested_annotation(sections.get(section), keys)
        value = typed_value(annotation, text) if annotation is not None else _toml_scalar(text)
        table = layer.setdefault(section, {})
        for key in keys[:-1]:
            if not isinstance(table.get(key), dict):
                table[key] = {}
            table = table[key]
        table[keys[-1]] = value
    return layer
