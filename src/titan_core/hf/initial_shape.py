"""The model shape of a run whose ``checkpoint.initial_load`` names a Hugging Face folder
(or a titan checkpoint made from one): read from its ``config.json`` through the spec's adapter.

A spec-section value that contradicts the file is an error listing each field (the
adapter's ``runtime_fields``, such as the RoPE table length, may differ). Light on
imports: it runs while the config is resolved, also for ``--print-config``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .adapter import adapter_of
from .folder import is_hf_folder, open_hf_folder
from .model_args import HF_CONFIG_IN_CHECKPOINT

WHAT = "checkpoint.initial_load"


def source_kind(path: Path) -> str:
    from ..checkpoint.weights import is_titan_checkpoint

    if is_hf_folder(path):
        return "hf"
    if is_titan_checkpoint(path):
        return "titan"
    if not path.exists():
        raise ConfigError(f"{WHAT}: {path} does not exist; give a Hugging Face model folder or a titan checkpoint "
                          f"folder (e.g. runs/x/checkpoints/step-000100).")
    # open_hf_folder names what a would-be HF folder lacks (no config.json, no safetensors ...).
    open_hf_folder(path, what=WHAT)
    raise AssertionError("unreachable")  # pragma: no cover


def initial_model_args(spec: Any, config: Any, *, tokenizer: Any) -> tuple[Any, str | None]:
    """(the model args of this run, where their shape came from): from config.json for an HF
    ``initial_load`` (a line saying so), else the flavor's (None).

    Also checks, before anything is trained, that an ``hf`` export will be possible.
    """
    vocab_size = tokenizer.vocab_size
    if config.checkpoint.export_at_end and config.checkpoint.export_format == "hf":
        from .export import check_hf_export

        check_hf_export(spec, tokenizer)  # now, not after training
    section = getattr(config, spec.name, None)
    source = config.checkpoint.initial_load
    kind = source_kind(Path(source)) if source else None
    hf_config = Path(source) / HF_CONFIG_IN_CHECKPOINT if source else None
    if kind == "titan" and hf_config is not None and hf_config.is_file():
        hf_dict = _read_json(hf_config)  # a checkpoint made by titan-convert from-hf carries its shape
    elif kind == "hf":
        hf_dict = open_hf_folder(source, what=WHAT).config
    else:
        return spec.model_args(config.model.flavor, section, vocab_size=vocab_size), None
    adapter = adapter_of(spec, purpose=f"{WHAT} of a Hugging Face folder")
    args = adapter.model_args_from_hf(hf_dict)
    chosen = {k: v for k, v in section.model_dump().items() if v is not None} if section is not None else {}
    conflicts = [f"{spec.name}.{k}={v!r} (config.json: {getattr(args, k)!r})"
                 for k, v in chosen.items() if k not in adapter.runtime_fields and getattr(args, k, v) != v]
    if conflicts:
        raise ConfigError(
            f"{WHAT}={source}: the model shape comes from its config.json, and these settings contradict it: "
            f"{'; '.join(conflicts)}. Remove them (or edit config.json)."
        )
    args = dataclasses.replace(args, **{k: v for k, v in chosen.items() if k in adapter.runtime_fields})
    model_vocab = getattr(args, "vocab_size", None)
    if isinstance(model_vocab, int) and vocab_size > model_vocab:
        raise ConfigError(
            f"{WHAT}={source}: the tokenizer has {vocab_size} tokens but the model's vocabulary (config.json "
            f"vocab_size) has {model_vocab}; use the tokenizer the model was trained with (--data.tokenizer)."
        )
    shape = ", ".join(f"{f.name}={getattr(args, f.name)}" for f in dataclasses.fields(args))
    shape_file = hf_config if kind == "titan" else Path(source) / "config.json"
    return args, f"model shape from {shape_file} (model.flavor is ignored): {shape}"


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{WHAT}: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{WHAT}: {path} is not a JSON object")
    return data
