"""Assemble and validate a run's config from all sources, loading the requested plugins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ValidationError

from ..boundary.plugin_boundary import SpecCalls
from ..config.booleans import refuse_booleans_for_numbers
from ..config.finite import refuse_nonfinite
from ..config.job import JobConfig, build_job_model
from ..config.layers import Layer, load_config_source, merge
from ..config.messages import describe
from ..config.overrides import overrides_layer, typed_value
from ..config.parallel_dims import ParallelDims
from ..config.sections import ParallelismSection
from ..data.documents import accepts_positions, check_document_masking
from ..errors import ConfigError, PluginError, did_you_mean
from ..parallel.context_parallel import require_support as require_context_parallel_support
from ..plugin import discovery
from ..plugin.emulation import new_run_notes
from ..plugin.protocols import ModelConverter, Tokenizer, TrainSpec
from ..plugin.resolved import MixedPrecision, promised_parallelism
from ..weights.source import StartingWeights
from .derived import run_device_and_backend, run_precision, run_tokenizer, run_weights


@dataclass(frozen=True)
class ResolvedConfig:
    """The validated config, the plugins it requested (loaded), and the facts derived from them.

    Each fact is derived once, in ``resolve_config``, and read from here by the Trainer,
    ``--dry-run``, the launcher's preflight and the conformance checks.
    """

    config: JobConfig
    spec: TrainSpec
    converters: list[tuple[str, type[ModelConverter[Any]]]]
    job_model: type[JobConfig]
    world_size: int
    #: this process's device (by its local rank) and the process-group backend, "auto" resolved
    device: torch.device
    backend: str
    tokenizer: Tokenizer
    #: checkpoint.initial_load resolved once: its kind, the file the model's shape comes from,
    #: and the model args (the flavor's, spec section and tokenizer vocabulary applied, or that
    #: file's), checked by the spec's validate_fn
    weights: StartingWeights
    #: every call into the spec's code, guarded and checked (plugin_boundary.py)
    calls: SpecCalls = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "calls", SpecCalls(self.spec))  # frozen: set once, here

    @property
    def model_args(self) -> Any:
        return self.weights.model_args

    @property
    def model_shape_note(self) -> str | None:
        """Where the shape came from when it is not the flavor's (printed by the Trainer)."""
        return self.weights.shape_note()

    @property
    def precision(self) -> MixedPrecision:
        """The run's compute, FSDP2 gather and reduce dtypes, resolved (handed to plugins as ``precision``)."""
        return run_precision(self.config, self.device)

    @property
    def plugin_parallelism(self) -> ParallelismSection:
        """``[parallelism]`` as plugins receive it: only values plugin API 1.0 documented (precision.promised_parallelism)."""
        return promised_parallelism(self.config.parallelism, self.precision)

    @property
    def dims(self) -> ParallelDims:
        """The parallel degrees, ``dp_shard=-1`` filled from the world size (by the config's validator)."""
        return self.config.parallel_dims


def _requested(layers: list[Layer], key: str, default: object) -> object:
    value = default
    for layer in layers:
        value = layer.get("model", {}).get(key, value)
    return value


def _plugin_sections(spec: TrainSpec, converters: list[tuple[str, type[ModelConverter[Any]]]]) -> dict[str, type[BaseModel]]:
    sections: dict[str, type[BaseModel]] = {}
    if spec.config_model is not None:
        sections[spec.name] = spec.config_model
    for name, cls in converters:
        if name == spec.name and spec.config_model is not None:  # one section cannot be both the spec's and this

            raise PluginError(f'spec "{spec.name}" and converter "{name}" share the name, which is the config '
                              f"section of each; rename one of them (their entry points) to use both in one run.")
        sections[name] = cls.Config
    return sections


def _validator_crash(exc: Exception, merged: Layer, sections: dict[str, type[BaseModel]]) -> ConfigError:
    """Name the plugin section whose validator raised ``exc`` (found by validating each one alone)."""
    culprit = "a validator"
    for name, model in sections.items():
        try:
            model.model_validate(merged.get(name, {}))
        except ValidationError:
            continue
        except Exception:
            culprit = f"the validator of section [{name}]"
            break
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return ConfigError(f"{culprit} raised {type(exc).__name__}: {first} (a validator must raise ValueError for a "
                       f"bad value). This is a bug in the plugin that provides it: check its settings, update "
                       f"it, or report it to its authors (--traceback shows where).")


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


def resolve_config(
    *, config_source: str | None, override_pairs: list[tuple[str, str]], world_size: int = 1
) -> ResolvedConfig:
    """Merge defaults < spec defaults < --config < overrides, and validate."""
    new_run_notes()  # what a run says once (emulated kernels) is said once per run resolved
    file_layer: Layer = load_config_source(config_source) if config_source else {}
    # Overrides are typed by the field they set, which needs the section's model. The core's
    # sections are known now (and name the spec and converters to load); the plugins'
    # sections only once those are loaded. Each pair is typed once, by one of the two.
    core_sections: dict[str, type[BaseModel]] = {
        name: f.annotation for name, f in JobConfig.model_fields.items()  # type: ignore[misc]
    }
    core_pairs = [pair for pair in override_pairs if pair[0].partition(".")[0] in core_sections]
    plugin_pairs = [pair for pair in override_pairs if pair[0].partition(".")[0] not in core_sections]
    core_layer = overrides_layer(core_pairs, core_sections)
    requested = _requested([file_layer, core_layer], "spec", None)
    spec_name = discovery.default_spec_name() if requested is None else str(requested)
    names = _requested([file_layer, core_layer], "converters", [])
    if isinstance(names, str):
        names = typed_value(list[str], names)
    spec = discovery.load_train_spec(spec_name)
    converters = [(n, discovery.load_converter(n)) for n in names] if isinstance(names, list) else []

    plugin_sections = _plugin_sections(spec, converters)
    job_model = build_job_model(plugin_sections)
    # The config records the spec it ran, also when it was the default.
    core_layer.setdefault("model", {})["spec"] = spec_name
    override_layer = {**core_layer, **overrides_layer(plugin_pairs, plugin_sections)}
    spec_layer: Layer = {k: dict(v) for k, v in spec.defaults.items()}
    _check_sections([file_layer, override_layer], job_model)
    merged = merge(spec_layer, file_layer, override_layer)
    refuse_nonfinite(merged)
    refuse_booleans_for_numbers(merged, job_model)
    try:
        config = job_model.model_validate(merged, context={"world_size": world_size})
    except ValidationError as exc:
        raise ConfigError(describe(exc, job_model)) from None
    except ConfigError:  # the core's own checks (parallel degrees) say what is wrong themselves
        raise
    except Exception as exc:  # a plugin's validator that crashed (pydantic passes anything but ValueError on)
        raise _validator_crash(exc, merged, plugin_sections) from exc
    refuse_nonfinite(config.model_dump(mode="python"))  # values pydantic converted (a TOML string "1e39")
    flavor = config.model.flavor
    if flavor not in spec.flavors:
        raise ConfigError(
            f'spec "{spec.name}" has no flavor "{flavor}".{did_you_mean(flavor, list(spec.flavors))} '
            f"Flavors: {', '.join(spec.flavors)}."
        )
    if config.data.document_masking:
        check_document_masking(spec_name=spec.name, model_cls=spec.model_cls, pp=config.parallelism.pp,
                               pipeline_takes_positions=spec.pipeline_takes_positions)
    if config.parallelism.cp > 1:
        require_context_parallel_support(spec.model_cls, spec_name=spec.name, cp=config.parallelism.cp)
    if config.parallelism.cp > 1 and config.parallelism.pp > 1 and accepts_positions(spec.model_cls) and \
            not spec.pipeline_takes_positions:
        raise ConfigError(
            f"parallelism.cp={config.parallelism.cp} with parallelism.pp={config.parallelism.pp}: the pipeline "
            f"stages of spec {spec.name} do not take positions (TrainSpec.pipeline_takes_positions), which context "
            f"parallelism needs to place each rank's tokens in the sequence. Use parallelism.pp=1 or cp=1"
        )
    device, backend = run_device_and_backend(config)
    calls = SpecCalls(spec)
    tokenizer = run_tokenizer(calls, config)
    weights = run_weights(calls, config, tokenizer=tokenizer, world_size=world_size)
    return ResolvedConfig(config, spec, converters, job_model, world_size, device=device, backend=backend,
                          tokenizer=tokenizer, weights=weights)


def installed_job_model() -> type[JobConfig]:
    """The config model with the section of every installed spec and converter: ``titan-train --schema``
    without a spec describes everything a run could be given (naming no spec is not an error there)."""
    sections: dict[str, type[BaseModel]] = {}
    for name in discovery.discover(discovery.SPECS):
        spec = discovery.load_train_spec(name)
        if spec.config_model is not None:
            sections[name] = spec.config_model
    for name in discovery.discover(discovery.CONVERTERS):
        sections.setdefault(name, discovery.load_converter(name).Config)
    return build_job_model(sections)
