"""The model shape of a run whose ``checkpoint.initial_load`` gives one: a Hugging Face
folder's ``config.json`` (or the ``hf_config.json`` a titan checkpoint made from one
carries), read through the spec's adapter.

A spec-section value that contradicts the file is an error listing each field (the
adapter's ``runtime_fields``, such as the RoPE table length, may differ). Light on
imports: it runs while the config is resolved, also for ``--print-config``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..hf.adapter import adapter_of
from ..hf.export import check_hf_export
from ..hf.folder import is_hf_folder, open_hf_folder
from ..run_files import atomic_write_text
from .load import check_hf_fits
from .source import HF_CONFIG_IN_CHECKPOINT, RECORDED, WHAT, source_kind
from .titan_checkpoint import is_titan_checkpoint

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from ..config.job import JobConfig
    from ..protocols import Tokenizer, TrainSpec


def shape_file(config: JobConfig) -> Path | None:
    """The ``config.json`` this run's model shape comes from; None when it is the flavor's.

    An HF folder's ``config.json``, or the ``hf_config.json`` that ``titan-convert from-hf``
    leaves in a titan checkpoint. A source that is neither (or does not exist) gives None
    here; loading it is what reports it.
    """

    source = config.checkpoint.initial_load
    if not source:
        return None
    path = Path(source)
    if is_hf_folder(path):
        return path / "config.json"
    carried = path / HF_CONFIG_IN_CHECKPOINT
    return carried if carried.is_file() and is_titan_checkpoint(path) else None


def shape_source(config: JobConfig) -> str:
    """``flavor NAME``, or ``shape from FILE`` when an ``initial_load`` gives the shape (for messages)."""
    file = shape_file(config)
    return f"flavor {config.model.flavor}" if file is None else f"shape from {file}"


def model_label(spec: TrainSpec, config: JobConfig) -> str:
    """How the run log names its model: ``spec/flavor``, or the spec and the config.json its shape came from."""
    file = shape_file(config)
    return f"{spec.name}/{config.model.flavor}" if file is None else f"{spec.name} (shape from {file})"


def config_json_model_args(spec: TrainSpec, config: JobConfig) -> Any | None:
    """The model args from the ``initial_load``'s config.json (None: the flavor gives them).

    The spec section's runtime fields apply on top; any other field it sets must agree
    with the file, or a ConfigError lists each one. Config validation, ``--dry-run`` and
    the real run all take the shape from here.
    """
    file = shape_file(config)
    if file is None:
        return None
    source = config.checkpoint.initial_load
    # A checkpoint made by titan-convert from-hf carries its shape; an HF folder's is read with its tensor headers.
    folder = None if file.name == HF_CONFIG_IN_CHECKPOINT else open_hf_folder(source, what=WHAT)
    hf_dict = _read_json(file) if folder is None else folder.config
    adapter = adapter_of(spec, purpose=f"{WHAT} of a Hugging Face folder")
    args = adapter.model_args_from_hf(hf_dict)
    if folder is not None:
        # Now (dry run included), from the headers: not after the model is built at this shape.
        check_hf_fits(folder, spec=spec, model_args=args)
    section = getattr(config, spec.name, None)
    chosen = {k: v for k, v in section.model_dump().items() if v is not None} if section is not None else {}
    conflicts = [f"{spec.name}.{k}={v!r} (config.json: {getattr(args, k)!r})"
                 for k, v in chosen.items() if k not in adapter.runtime_fields and getattr(args, k, v) != v]
    if conflicts:
        raise ConfigError(
            f"{WHAT}={source}: the model shape comes from its config.json, and these settings contradict it: "
            f"{'; '.join(conflicts)}. Remove them (or edit config.json)."
        )
    return dataclasses.replace(args, **{k: v for k, v in chosen.items() if k in adapter.runtime_fields})


def initial_model_args(spec: TrainSpec, config: JobConfig, *, tokenizer: Tokenizer) -> tuple[Any, str | None]:
    """(the model args of this run, a line saying where their shape came from): from
    config.json for an HF ``initial_load``, else the flavor's (and no line).

    Also checks, before anything is trained, that an ``hf`` export will be possible.
    ``resolve_config`` calls it once (through ``config/derived.py``); the real run,
    ``--dry-run`` and the launcher read the result.
    """
    vocab_size = tokenizer.vocab_size
    if config.checkpoint.export_at_end and config.checkpoint.export_format == "hf":
        check_hf_export(spec, tokenizer)  # now, not after training
    source = config.checkpoint.initial_load
    if source:
        source_kind(Path(source))  # a source that is no model folder fails now, not after set-up
    args = config_json_model_args(spec, config)
    if args is None:
        return spec.model_args(config.model.flavor, getattr(config, spec.name, None), vocab_size=vocab_size), None
    model_vocab = getattr(args, "vocab_size", None)
    if isinstance(model_vocab, int) and vocab_size > model_vocab:
        raise ConfigError(
            f"{WHAT}={source}: the tokenizer has {vocab_size} tokens but the model's vocabulary (config.json "
            f"vocab_size) has {model_vocab}; use the tokenizer the model was trained with (--data.tokenizer)."
        )
    shape = ", ".join(f"{f.name}={getattr(args, f.name)}" for f in dataclasses.fields(args))
    return args, f"model shape from {shape_file(config)} (model.flavor is ignored): {shape}"


def read_json_object(path: Path, *, unreadable: str, not_object: str) -> dict[str, Any]:
    """A JSON object file; a ConfigError from ``unreadable`` ({path}, {exc}) or ``not_object`` ({path}) otherwise."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(unreadable.format(path=path, exc=exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(not_object.format(path=path))
    return data


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, unreadable=f"{WHAT}: cannot read {{path}}: {{exc}}",
                            not_object=f"{WHAT}: {{path}} is not a JSON object")


def record_shape_file(config: JobConfig, run_dir: Path) -> None:
    """Keep the config.json this run's shape comes from in its run folder (rank 0, on a fresh start).

    Only the shapes of the weights are in the run's checkpoints; RoPE theta, the norm's
    epsilon and the RoPE scaling are not. A resume compares against this copy.
    """

    file = shape_file(config)
    if file is not None:
        atomic_write_text(Path(run_dir) / RECORDED, file.read_text(encoding="utf-8"))


def check_shape_file_unchanged(spec: TrainSpec, config: JobConfig, model_args: DataclassInstance, run_dir: Path) -> None:
    """On a resume: the config.json of ``initial_load`` must still give the model the run was trained with.

    An edited file (another rope_theta, say) would otherwise change the model under the run's
    checkpoints without a word. Every rank checks the same files, so all stop together.
    """
    file, recorded = shape_file(config), Path(run_dir) / RECORDED
    if file is None or not recorded.is_file():  # no HF shape, or a run started before this record existed
        return
    adapter = adapter_of(spec, purpose=f"{WHAT} of a Hugging Face folder")
    then = adapter.model_args_from_hf(_read_json(recorded))
    changed = [f"{f.name}: {getattr(then, f.name)!r} then, {getattr(model_args, f.name)!r} now"
               for f in dataclasses.fields(model_args)
               if f.name not in adapter.runtime_fields and getattr(then, f.name) != getattr(model_args, f.name)]
    if changed:
        raise ConfigError(
            f"{WHAT}={config.checkpoint.initial_load}: {file} has changed since this run started, and this "
            f"resume would change its model ({'; '.join(changed)}). Restore it from {recorded} (the copy taken "
            f"when the run started), or start a new run in another job.run_dir."
        )
