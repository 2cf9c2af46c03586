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
from ..hf.folder import HFFolder, open_hf_folder
from ..runtime.run_files import atomic_write_text
from .load import check_hf_fits
from .source import HF_CONFIG_IN_CHECKPOINT, RECORDED, WHAT, SourceKind, StartingWeights, source_kind

if TYPE_CHECKING:
    from ..config.job import JobConfig
    from ..plugin.protocols import Tokenizer, TrainSpec


def shape_file_of(kind: SourceKind, path: Path) -> Path | None:
    """The ``config.json`` a source of ``kind`` gives the model's shape from; None: the flavor's.

    An HF folder's ``config.json``, or the ``hf_config.json`` that ``titan-convert from-hf``
    leaves in a titan checkpoint (a titan checkpoint of a run keeps only its weights' shapes).
    """
    if kind == "hf":
        return path / "config.json"
    carried = path / HF_CONFIG_IN_CHECKPOINT
    return carried if kind == "titan" and carried.is_file() else None


def hf_folder_args(spec: TrainSpec, folder: HFFolder, *, what: str, purpose: str) -> Any:
    """The model args an HF folder's config.json gives, checked against its tensor headers (no weight read),
    so a config.json whose shape the tensors do not have is refused now, not after the model is built."""
    args = adapter_of(spec, purpose=purpose).model_args_from_hf(folder.config)
    check_hf_fits(folder, spec=spec, model_args=args, what=what)
    return args


def hf_starting_weights(spec: TrainSpec, path: Path, *, what: str, purpose: str) -> tuple[StartingWeights, HFFolder]:
    """An HF folder as starting weights of the shape its config.json gives (``titan-convert from-hf``), and the
    folder opened (its tensor headers read)."""
    folder = open_hf_folder(path, what=what)
    args = hf_folder_args(spec, folder, what=what, purpose=purpose)
    return StartingWeights("hf", Path(path), Path(path) / "config.json", args, flavor=what), folder


def _shape_file_args(spec: TrainSpec, config: JobConfig, kind: SourceKind, path: Path, file: Path) -> Any:
    """The model args from the source's config.json: the spec section's runtime fields apply on top; any
    other field it sets must agree with the file, or a ConfigError lists each one."""
    purpose = f"{WHAT} of a Hugging Face folder"
    if kind == "hf":  # an HF folder's is read with its tensor headers (checked now, dry run included)
        args = hf_folder_args(spec, open_hf_folder(path, what=WHAT), what=WHAT, purpose=purpose)
    else:  # a checkpoint made by titan-convert from-hf carries its shape
        hf_dict = _read_json(file)
        args = adapter_of(spec, purpose=purpose).model_args_from_hf(hf_dict)
    adapter = adapter_of(spec, purpose=purpose)
    section = getattr(config, spec.name, None)
    chosen = {k: v for k, v in section.model_dump().items() if v is not None} if section is not None else {}
    conflicts = [f"{spec.name}.{k}={v!r} (config.json: {getattr(args, k)!r})"
                 for k, v in chosen.items() if k not in adapter.runtime_fields and getattr(args, k, v) != v]
    if conflicts:
        raise ConfigError(
            f"{WHAT}={config.checkpoint.initial_load}: the model shape comes from its config.json, and these "
            f"settings contradict it: {'; '.join(conflicts)}. Remove them (or edit config.json)."
        )
    return dataclasses.replace(args, **{k: v for k, v in chosen.items() if k in adapter.runtime_fields})


def resolve_starting_weights(spec: TrainSpec, config: JobConfig, *, tokenizer: Tokenizer) -> StartingWeights:
    """``checkpoint.initial_load`` resolved once: its kind, the file the model's shape comes from and the
    model args (from that file, else the flavor's). ``resolve_config`` calls it (through ``plan/derived.py``);
    the real run, ``--dry-run`` and the launcher read the result.

    Also checks, before anything is trained, that an ``hf`` export will be possible.
    """
    vocab_size = tokenizer.vocab_size
    flavor = config.model.flavor
    if config.checkpoint.export_at_end and config.checkpoint.export_format == "hf":
        check_hf_export(spec, tokenizer)  # now, not after training
    source = config.checkpoint.initial_load
    if not source:
        args = spec.model_args(flavor, getattr(config, spec.name, None), vocab_size=vocab_size)
        return StartingWeights("none", None, None, args, flavor)
    path = Path(source)
    kind = source_kind(path)  # a source that is no model folder fails now, not after set-up
    file = shape_file_of(kind, path)
    if file is None:
        args = spec.model_args(flavor, getattr(config, spec.name, None), vocab_size=vocab_size)
        return StartingWeights(kind, path, None, args, flavor)
    args = _shape_file_args(spec, config, kind, path, file)
    model_vocab = getattr(args, "vocab_size", None)
    if isinstance(model_vocab, int) and vocab_size > model_vocab:
        raise ConfigError(
            f"{WHAT}={source}: the tokenizer has {vocab_size} tokens but the model's vocabulary (config.json "
            f"vocab_size) has {model_vocab}; use the tokenizer the model was trained with (--data.tokenizer)."
        )
    return StartingWeights(kind, path, file, args, flavor)


def read_json_object(path: Path, *, unreadable: str, not_object: str) -> dict[str, Any]:
    """A JSON object file; a ConfigError from ``unreadable`` ({path}, {exc}) or ``not_object`` ({path}) otherwise."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    # ValueError, not only JSONDecodeError: a number of over 4,300 digits is refused by int() inside the parser
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(unreadable.format(path=path, exc=exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(not_object.format(path=path))
    return data


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, unreadable=f"{WHAT}: cannot read {{path}}: {{exc}}",
                            not_object=f"{WHAT}: {{path}} is not a JSON object")


def record_shape_file(weights: StartingWeights, run_dir: Path) -> None:
    """Keep the config.json this run's shape comes from in its run folder (rank 0, on a fresh start).

    Only the shapes of the weights are in the run's checkpoints; RoPE theta, the norm's
    epsilon and the RoPE scaling are not. A resume compares against this copy.
    """

    if weights.shape_file is not None:
        atomic_write_text(Path(run_dir) / RECORDED, weights.shape_file.read_text(encoding="utf-8"))


def check_shape_file_unchanged(spec: TrainSpec, weights: StartingWeights, run_dir: Path) -> None:
    """On a resume: the config.json of ``initial_load`` must still give the model the run was trained with.

    An edited file (another rope_theta, say) would otherwise change the model under the run's
    checkpoints without a word. Every rank checks the same files, so all stop together.
    """
    file, recorded, model_args = weights.shape_file, Path(run_dir) / RECORDED, weights.model_args
    if file is None or not recorded.is_file():  # no HF shape, or a run started before this record existed
        return
    adapter = adapter_of(spec, purpose=f"{WHAT} of a Hugging Face folder")
    then = adapter.model_args_from_hf(_read_json(recorded))
    changed = [f"{f.name}: {getattr(then, f.name)!r} then, {getattr(model_args, f.name)!r} now"
               for f in dataclasses.fields(model_args)
               if f.name not in adapter.runtime_fields and getattr(then, f.name) != getattr(model_args, f.name)]
    if changed:
        raise ConfigError(
            f"{WHAT}={weights.path}: {file} has changed since this run started, and this "
            f"resume would change its model ({'; '.join(changed)}). Restore it from {recorded} (the copy taken "
            f"when the run started), or start a new run in another job.run_dir."
        )
