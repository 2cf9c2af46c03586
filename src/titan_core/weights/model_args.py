"""The model args of a titan checkpoint, for tools that have no run config at hand (titan-convert).

In order: ``hf_config.json`` inside the checkpoint (written by ``titan-convert from-hf``),
the ``initial_load_config.json`` a run started from a Hugging Face folder keeps two levels up,
the run's ``config.toml`` two levels up (``<run_dir>/checkpoints/step-N``, written by
titan-train, with its spec section and an HF ``initial_load``), or an explicit config.
The result is checked against the shapes the checkpoint's identity file records.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..boundary.meta_model import meta_model
from ..errors import ConfigError
from ..hf.adapter import adapter_of
from ..hf.folder import open_hf_folder
from ..runtime.folder_kinds import is_hf_folder
from ..runtime.os_errors import special_kind
from .shape import read_json_object
from .source import HF_CONFIG_IN_CHECKPOINT, RECORDED
from .titan_checkpoint import saved_param_shapes

if TYPE_CHECKING:
    from ..plugin.protocols import TrainSpec


def run_config_of(checkpoint: Path) -> Path | None:
    candidate = Path(checkpoint).resolve().parent.parent / "config.toml"
    if os.path.lexists(candidate) and not candidate.is_file():  # was taken as absent: a wrong flavor's model
        raise ConfigError(f"{candidate} is {special_kind(candidate)}, not the run's config file; put the config.toml "
                          "the run wrote back, or pass one with --config.")
    return candidate if candidate.is_file() else None


def checkpoint_model_args(checkpoint: Path, *, spec: TrainSpec, flavor: str, run_config: dict[str, Any],
                          vocab_size: int) -> Any:
    """Model args for ``checkpoint`` (see the module docstring); ConfigError when none fits its shapes."""
    section_model = spec.config_model
    raw_section = run_config.get(spec.name, {}) if isinstance(run_config.get(spec.name, {}), dict) else {}
    section = section_model.model_validate(raw_section) if section_model is not None else None
    hf_file = Path(checkpoint) / HF_CONFIG_IN_CHECKPOINT
    initial = str(run_config.get("checkpoint", {}).get("initial_load", "") or "")
    recorded = Path(checkpoint).resolve().parent.parent / RECORDED
    if hf_file.is_file():
        args = adapter_of(spec, purpose="this checkpoint").model_args_from_hf(_json_object(hf_file))
        source = str(hf_file)
    elif initial and recorded.is_file():
        # The copy the run took when it started: the HF folder's own config.json may have changed since.
        args = adapter_of(spec, purpose="this checkpoint").model_args_from_hf(_json_object(recorded))
        source = f"{recorded} (the run's checkpoint.initial_load config.json)"
    elif initial and is_hf_folder(Path(initial)):
        args = adapter_of(spec, purpose="this checkpoint").model_args_from_hf(
            open_hf_folder(initial, what="the run's checkpoint.initial_load").config)
        source = f"{initial}/config.json (the run's checkpoint.initial_load)"
    else:
        args = spec.model_args(flavor, section, vocab_size=vocab_size)
        source = f'flavor "{flavor}"' + (" with the run's config.toml" if run_config else "")
    if section is not None and (hf_file.is_file() or initial):
        runtime = getattr(spec.state_dict_adapter, "runtime_fields", ())
        chosen = {k: v for k, v in section.model_dump().items() if v is not None and k in runtime}
        args = dataclasses.replace(args, **chosen)
    model = meta_model(spec, args)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    saved = saved_param_shapes(Path(checkpoint))
    wrong = sorted(k for k in set(ours) | set(saved) if ours.get(k) != saved.get(k))
    if wrong:
        k = wrong[0]
        raise ConfigError(
            f"{checkpoint}: the model shape from {source} does not match the checkpoint ({len(wrong)} tensors "
            f"differ, e.g. {k}: checkpoint {list(saved.get(k, ()))}, model {list(ours.get(k, ()))}). Pass the "
            f"run's config with --config RUN_DIR/config.toml."
        )
    return args


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object file (a config.json copy); ConfigError naming it otherwise."""
    return read_json_object(path, unreadable="cannot read {path}: {exc}; it is a copy of a Hugging Face config.json.",
                            not_object="{path} is not a JSON object; it should be a copy of a Hugging Face config.json.")
