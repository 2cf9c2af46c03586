"""A whole model on one process, from a titan checkpoint (any layout it was saved from) or a
Hugging Face folder: what ``titan-convert to-hf`` and ``titan-generate`` start from.

The checkpoint is checked as a resume checks it (complete, identity file, checksums,
shapes) and DCP reshards it into one plain model; nothing but the weights is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torch import nn

from ..boundary.meta_model import meta_model
from ..checkpoint.identity import read_record
from ..config.finite import refuse_nonfinite
from ..config.layers import load_config_source
from ..errors import ConfigError
from ..hf.tokenizer_folder import load_tokenizer_folder
from ..models.ties import declared_ties, retie_weights
from ..plan.tokenizer import build_tokenizer
from ..plugin import discovery
from ..runtime.os_errors import describe_os_error
from ..weights.load import load_hf_weights
from ..weights.model_args import checkpoint_model_args, run_config_of
from ..weights.shape import hf_starting_weights

if TYPE_CHECKING:
    from ..plugin.protocols import TrainSpec
from ..weights.titan_checkpoint import load_model_weights


@dataclass
class WholeModel:
    model: nn.Module
    spec: Any  # the TrainSpec
    model_args: Any
    tokenizer: Any


def _finish(model: nn.Module) -> None:
    """Non-persistent buffers (e.g. a rotary table) hold garbage after ``to_empty``: recompute them.

    Called before the weights are loaded: ``init_buffers`` may also reset persistent buffers (a MoE
    router's bias starts at zero), and the loaded values must win."""
    init_buffers = getattr(model, "init_buffers", None)
    if init_buffers is not None:
        init_buffers()


def cpu_model(spec: TrainSpec, model_args: object) -> tuple[nn.Module, list[tuple[str, str]]]:
    """The model allocated on the CPU (values uninitialised, ties re-made) and its declared ties."""
    model = meta_model(spec, model_args)
    model.to_empty(device="cpu")
    ties = declared_ties(model)
    retie_weights(model, ties)
    return model, ties


def read_checked_run_config(path: Path | None) -> dict[str, Any]:
    """The run's config.toml, read and checked as titan-train reads --config (regular file, size, UTF-8,
    TOML, finite numbers): it comes from disk, like any other input."""
    if path is None:
        return {}
    try:
        layer = load_config_source(str(path) if str(path).endswith(".toml") or "/" in str(path) else f"./{path}")
    except OSError as exc:
        raise ConfigError(f"cannot read the run config {path}: {describe_os_error(exc)}") from None
    refuse_nonfinite(layer)
    return layer


def check_config_matches(run_config: Mapping[str, Any], config_path: Path | None, *, spec: str, flavor: str,
                         checkpoint: Path) -> None:
    """The run config the model's shape is read from must be one of the checkpoint's spec and flavor: another
    spec's config gives another shape, and the load would fail on a tensor shape without naming why."""
    model = run_config.get("model", {})
    said = (model.get("spec"), model.get("flavor")) if isinstance(model, dict) else (None, None)
    if said[0] not in (None, "", spec) or said[1] not in (None, "", flavor):
        raise ConfigError(f"{config_path} is the config of a {said[0]}/{said[1]} run, but {checkpoint} was saved by "
                          f"spec {spec}, flavor {flavor} (titan_checkpoint.json): the model's shape would be read "
                          f"from the wrong spec. Give the checkpoint's own run config.toml with --config (or leave "
                          f"--config out when the checkpoint is inside its run folder).")


def load_titan_checkpoint(checkpoint: Path, *, config: Path | None = None,
                          weights: Literal["raw", "ema"] = "raw") -> WholeModel:
    """The model of ``checkpoint`` (a step-N folder) in float32 on the CPU; ``config``: the run's
    config.toml (default: two levels up, where titan-train writes it); ``weights``: the trained
    weights, or the checkpoint's EMA of them."""

    identity = read_record(checkpoint).identity
    config_path = config or run_config_of(checkpoint)
    run_config = read_checked_run_config(config_path)
    check_config_matches(run_config, config_path, spec=identity.spec, flavor=identity.flavor, checkpoint=checkpoint)
    spec = discovery.load_train_spec(identity.spec)
    data = run_config.get("data", {})
    tokenizer = build_tokenizer(str(data.get("tokenizer", "builtin") if isinstance(data, dict) else "builtin"))
    model_args = checkpoint_model_args(checkpoint, spec=spec, flavor=identity.flavor, run_config=run_config,
                                       vocab_size=tokenizer.vocab_size)
    model, _ = cpu_model(spec, model_args)
    _finish(model)  # before the weights: a persistent buffer it resets (a routing bias) is then loaded
    load_model_weights(checkpoint, [model], weights=weights)
    return WholeModel(model, spec, model_args, tokenizer)


def spec_reading(folder: Path, *, what: str) -> str:
    """The installed spec whose adapter reads ``folder``'s config.json (its model_type says the family): the
    only one, or the default spec when several or none do (their own error then names the folder)."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return discovery.default_spec_name()
    readers = []
    for name in sorted(discovery.discover(discovery.SPECS)):
        adapter = discovery.load_train_spec(name).state_dict_adapter
        if adapter is None or not isinstance(config, dict):
            continue
        try:
            adapter.model_args_from_hf(config)
        except Exception:  # noqa: BLE001 (any refusal means: not this spec's family)
            continue
        readers.append(name)
    if len(readers) == 1:
        return readers[0]
    if len(readers) > 1:
        raise ConfigError(f"{what}: {folder}/config.json can be read by the specs {', '.join(readers)}; choose one "
                          f"with --spec NAME.")
    return discovery.default_spec_name()


def load_hf_folder(folder_path: Path, *, spec_name: str | None, what: str) -> WholeModel:
    """The model of a Hugging Face folder through the spec's adapter (default: the only installed spec)."""

    spec = discovery.load_train_spec(spec_name or spec_reading(folder_path, what=what))
    weights, folder = hf_starting_weights(spec, folder_path, what=what, purpose=what)  # before any weight is allocated
    model_args = weights.model_args
    model, ties = cpu_model(spec, model_args)
    _finish(model)  # before the weights, as above
    load_hf_weights(folder, spec=spec, model_parts=[model], model_args=model_args, ties=ties, what=what)
    return WholeModel(model, spec, model_args, load_tokenizer_folder(folder_path))
