"""Assemble and validate a run's config from all sources, loading the requested plugins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from .. import discovery
from ..errors import ConfigError, did_you_mean
from ..protocols import ModelConverter, TrainSpec
from .errors import describe
from .finite import refuse_nonfinite
from .job import JobConfig, build_job_model
from .overrides import overrides_layer, typed_value
from .sections import ModelSection
from .sources import Layer, load_config_source, merge


@dataclass(frozen=True)
class ResolvedConfig:
    """The validated config and the plugins it requested, loaded."""

    config: JobConfig
    spec: TrainSpec
    converters: list[tuple[str, type[ModelConverter]]]
    job_model: type[JobConfig]
    world_size: int


def _requested(layers: list[Layer], key: str, default: Any) -> Any:
    value = default
    for layer in layers:
        value = layer.get("model", {}).get(key, value)
    return value


def _plugin_sections(spec: TrainSpec, converters: list[tuple[str, type[ModelConverter]]]) -> dict[str, type[BaseModel]]:
    sections: dict[str, type[BaseModel]] = {}
    if spec.config_model is not None:
        sections[spec.name] = spec.config_model
    for name, cls in converters:
        sections[name] = cls.Config
    return sections


def _check_sections(layers: list[Layer], job_model: type[JobConfig]) -> None:
    """Name a section meant for an unrequested converter, or misspelt, before pydantic does."""
    known = set(job_model.model_fields)
    installed = set(discovery.discover(discovery.CONVERTERS))
    for layer in layers:
        for section in layer:
            if section in known:
                continue
            if section in installed:
                raise ConfigError(
                    f'section [{section}] configures converter "{section}", which this run does not request. '
                    f"Add it with --converters ...,{section} (or model.converters), or remove the section."
                )
            raise ConfigError(
                f'unknown section "{section}".{did_you_mean(section, known)} Known sections: {", ".join(sorted(known))}.'
            )


def check_seq_len(config: JobConfig, args: Any, spec_name: str) -> None:
    """training.seq_len within the model's ``max_seq_len`` (when its args declare one), so that
    --dry-run refuses what the run would refuse at its first forward."""
    from ..hf.initial_load import shape_source

    limit = getattr(args, "max_seq_len", None)
    if isinstance(limit, int) and config.training.seq_len > limit:
        raise ConfigError(
            f"training.seq_len={config.training.seq_len} is longer than the model's max_seq_len={limit} "
            f"(spec {spec_name}, {shape_source(config)}). Lower --training.seq_len, or raise the model's "
            f"limit (e.g. --{spec_name}.max_seq_len={config.training.seq_len}) where the spec allows it."
        )


def resolve_config(
    *, config_source: str | None, override_pairs: list[tuple[str, str]], world_size: int = 1
) -> ResolvedConfig:
    """Merge defaults < spec defaults < --config < overrides, and validate."""
    file_layer: Layer = load_config_source(config_source) if config_source else {}
    # Overrides are typed by the field they set, which needs the model class; the spec
    # and converter names themselves are core fields, so read them first.
    core_sections = {name: f.annotation for name, f in JobConfig.model_fields.items()}
    early = overrides_layer(override_pairs, core_sections)  # type: ignore[arg-type]
    spec_name = str(_requested([file_layer, early], "spec", ModelSection().spec))
    names = _requested([file_layer, early], "converters", [])
    if isinstance(names, str):
        names = typed_value(list[str], names)
    spec = discovery.load_train_spec(spec_name)
    converters = [(n, discovery.load_converter(n)) for n in names] if isinstance(names, list) else []

    job_model = build_job_model(_plugin_sections(spec, converters))
    sections = {name: f.annotation for name, f in job_model.model_fields.items()}
    override_layer = overrides_layer(override_pairs, sections)  # type: ignore[arg-type]
    spec_layer: Layer = {k: dict(v) for k, v in spec.defaults.items()}
    _check_sections([file_layer, override_layer], job_model)
    merged = merge(spec_layer, file_layer, override_layer)
    refuse_nonfinite(merged)
    try:
        config = job_model.model_validate(merged, context={"world_size": world_size})
    except ValidationError as exc:
        raise ConfigError(describe(exc, job_model)) from None
    flavor = config.model.flavor
    if flavor not in spec.flavors:
        raise ConfigError(
            f'spec "{spec.name}" has no flavor "{flavor}".{did_you_mean(flavor, list(spec.flavors))} '
            f"Flavors: {', '.join(spec.flavors)}."
        )
    from ..hf.initial_load import config_json_model_args

    # An initial_load with a config.json gives the shape (as in the run), else the flavor does.
    args = config_json_model_args(spec, config)
    if args is None:
        args = spec.model_args(flavor, getattr(config, spec.name, None), vocab_size=None)
    check_seq_len(config, args, spec.name)
    if spec.validate_fn is not None:
        spec.validate_fn(args, parallelism=config.parallelism, training=config.training, world_size=world_size)
    return ResolvedConfig(config, spec, converters, job_model, world_size)
