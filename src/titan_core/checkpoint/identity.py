"""What a checkpoint records about the run that wrote it, and the resume-time comparison.

``titan_checkpoint.json`` (written by rank 0, the last file before publishing)
holds the run identity (spec, flavor, converters, full parameter shapes), the step
and tokens seen, and a manifest of every other file with its size and CRC-32, so a
truncated or overwritten shard is reported by name instead of loading garbage.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..optim.param_groups import describe_difference
from .json_strict import unique_keys
from .layout import IDENTITY_FILE

FORMAT_VERSION = 2  # 2: tensors as raw bytes with tensor_index.json, no pickles (1 used DCP's .metadata)
_MAX_RECORD_BYTES = 64 << 20


@dataclass(frozen=True)
class RunIdentity:
    """What resume compares between the checkpoint and the current run.

    ``param_shapes`` maps each canonical state-dict key (parameters and persistent
    buffers, as ``get_model_state_dict`` names them) to its full, unsharded shape,
    over all pipeline stages; build it with ``collect_param_shapes``.
    """

    spec: str
    flavor: str
    converters: tuple[str, ...]
    param_shapes: dict[str, tuple[int, ...]]
    # Optimizer parameter groups (param_groups.layout); None: not recorded (older checkpoint, a spec's own optimizer).
    param_groups: dict[str, Any] | None = None
    # What it trains on (data/identity.py: per source its data source, weight and fingerprint); None: not
    # recorded (older checkpoint, a spec's own data loader).
    data: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "spec": self.spec,
            "flavor": self.flavor,
            "converters": list(self.converters),
            "param_shapes": {k: list(v) for k, v in sorted(self.param_shapes.items())},
        }
        if self.param_groups is not None:
            out["param_groups"] = self.param_groups
        if self.data is not None:
            out["data"] = self.data
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> RunIdentity:
        return RunIdentity(
            spec=str(data["spec"]),
            flavor=str(data["flavor"]),
            converters=tuple(str(c) for c in data["converters"]),
            param_shapes={str(k): tuple(int(d) for d in v) for k, v in data["param_shapes"].items()},
            param_groups=_groups_or_none(data.get("param_groups")),
            data=_data_or_none(data.get("data")),
        )


def _groups_or_none(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and {"weight_decay", "lr_mult"} <= set(g)
        for g in value.values()
    ):
        raise ValueError("param_groups is not a mapping of group name -> {weight_decay, lr_mult, params}")
    return value


def _data_or_none(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(d, dict) and isinstance(d.get("fingerprint"), str) and isinstance(d.get("weight"), int | float)
        and not isinstance(d.get("weight"), bool) for d in value.values()
    ):
        raise ValueError("data is not a mapping of source name -> {source, weight, fingerprint}")
    return value


def describe_data_change(saved: dict[str, Any] | None, current: dict[str, Any] | None) -> str | None:
    """What differs between the data a checkpoint was trained on and this run's, in a phrase; None: the same
    (or one side not recorded)."""
    if saved is None or current is None:
        return None
    dropped, added = sorted(set(saved) - set(current)), sorted(set(current) - set(saved))
    changes = [f"{name} is not in this run's data" for name in dropped]
    changes += [f"{name} is new (not in the checkpoint's data)" for name in added]
    for name in sorted(set(saved) & set(current)):
        was, now = saved[name], current[name]
        if abs(float(was["weight"]) - float(now["weight"])) > 1e-9:
            changes.append(f"{name} had a share of {float(was['weight']):.4g} of the rows, {float(now['weight']):.4g} now")
        if was["fingerprint"] != now["fingerprint"]:
            source = f" ({now.get('source')})" if now.get("source") else ""
            changes.append(f"{name}{source} holds other tokens than it did (fingerprint {was['fingerprint']} in "
                           f"the checkpoint, {now['fingerprint']} now: other files, edited or swapped shards, "
                           f"another tokenizer or validation split)")
    return "; ".join(changes) if changes else None


def check_data(saved: RunIdentity, current: RunIdentity, *, path: Path, allow_data_change: bool) -> str | None:
    """CheckpointError when the data changed and that is not allowed; the change (a phrase) when it is."""
    change = describe_data_change(saved.data, current.data)
    if change is None or allow_data_change:
        return change
    raise CheckpointError(
        f"checkpoint {path} was trained on other data: {change}. Its data-loader position (epoch, windows "
        f"consumed, rows per mixture source) belongs to that data. Resume with the data settings it was written "
        f"with; or pass --checkpoint.allow_data_change=true to resume anyway (the position carries over: after a "
        f"weight change the mixture serves the sources whose share rose until their row counts catch up); or "
        f"start a new run folder from its weights with --checkpoint.initial_load={path} (a fresh optimizer and "
        f"data order)."
    )


@dataclass(frozen=True)
class ResumeInfo:
    """What ``CheckpointManager.resume`` loaded."""

    step: int
    tokens_seen: int
    path: Path
    optimizer_loaded: bool = True


@dataclass(frozen=True)
class CheckpointRecord:
    """The parsed identity file of one checkpoint."""

    identity: RunIdentity
    step: int
    tokens_seen: int
    world_size: int
    files: dict[str, tuple[int, int]]  # relative name -> (size, crc32)


def write_record(folder: Path, record: CheckpointRecord) -> None:
    """Write and fsync the identity file (the caller publishes the folder afterwards)."""
    payload = {
        "format": FORMAT_VERSION,
        "step": record.step,
        "tokens_seen": record.tokens_seen,
        "world_size": record.world_size,
        "identity": record.identity.to_json(),
        "files": {name: {"size": size, "crc32": crc} for name, (size, crc) in sorted(record.files.items())},
    }
    path = folder / IDENTITY_FILE
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def read_record(folder: Path) -> CheckpointRecord:
    """Parse the identity file; any damage is a CheckpointError naming the file."""
    path = folder / IDENTITY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # a symlinked identity file is refused, not followed
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(_MAX_RECORD_BYTES + 1)
        if len(raw) > _MAX_RECORD_BYTES:
            raise ValueError(f"it is larger than {_MAX_RECORD_BYTES} bytes")
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant,
                          object_pairs_hook=unique_keys)
        if not isinstance(data, dict):
            raise ValueError("it is not a JSON object")
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"unknown format {data.get('format')!r} (this titan-core reads {FORMAT_VERSION})")
        record = CheckpointRecord(
            identity=RunIdentity.from_json(data["identity"]),
            step=int(data["step"]),
            tokens_seen=int(data["tokens_seen"]),
            world_size=int(data["world_size"]),
            files={str(k): (_count(v["size"]), _count(v["crc32"])) for k, v in data["files"].items()},
        )
        if record.step < 0 or record.tokens_seen < 0 or record.world_size < 1:
            raise ValueError("step and tokens_seen must be >= 0 and world_size >= 1")
        return record
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CheckpointError(
            f"checkpoint identity file {path} is unreadable or corrupt ({type(exc).__name__}: {exc}). "
            f"The checkpoint cannot be trusted; resume from another step-N folder."
        ) from exc


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


def check_identity(saved: RunIdentity, current: RunIdentity, *, path: Path, allow_converter_change: bool) -> bool:
    """Raise CheckpointError when the checkpoint cannot be resumed by this run.

    Returns True when the converter list differs and the change is allowed (the
    caller then loads the model weights only).
    """
    if saved.spec != current.spec:
        raise CheckpointError(
            f"checkpoint {path} was written by spec {saved.spec!r} but this run uses spec {current.spec!r}. "
            f"Resume with --model.spec={saved.spec} or start fresh with --checkpoint.resume=never."
        )
    if saved.flavor != current.flavor:
        raise CheckpointError(
            f"checkpoint {path} was written with flavor {saved.flavor!r} but this run uses flavor "
            f"{current.flavor!r}. Resume with --model.flavor={saved.flavor} or start fresh with "
            f"--checkpoint.resume=never."
        )
    converters_changed = saved.converters != current.converters
    if converters_changed and not allow_converter_change:
        raise CheckpointError(
            f"checkpoint {path} was written with converters {list(saved.converters)} but this run uses "
            f"{list(current.converters)}. Converters change the numerics and possibly the optimizer state; "
            f"pass --checkpoint.allow_converter_change=true to load the model weights anyway (the optimizer "
            f"state is then not loaded), or use the converters {list(saved.converters)}."
        )
    _check_shapes(saved.param_shapes, current.param_shapes, path=path)
    if not converters_changed:  # with a converter change the optimizer state is not loaded anyway
        _check_param_groups(saved.param_groups, current.param_groups, path=path)
    return converters_changed


def _check_param_groups(saved: dict[str, Any] | None, current: dict[str, Any] | None, *, path: Path) -> None:
    if saved is None or current is None:
        return
    difference = describe_difference(saved, current)
    if difference is not None:
        raise CheckpointError(
            f"checkpoint {path} was written with other optimizer parameter groups: {difference}. Its optimizer "
            f"state belongs to those groups; resume with the same [optimizer] weight_decay, "
            f"no_decay_norms_biases_embeddings and param_groups, or start fresh with --checkpoint.resume=never."
        )


def _check_shapes(saved: dict[str, tuple[int, ...]], current: dict[str, tuple[int, ...]], *, path: Path) -> None:
    for fqn in sorted(set(saved) | set(current)):
        a, b = saved.get(fqn), current.get(fqn)
        if a == b:
            continue
        if a is None:
            detail = f"{fqn!r} (shape {list(b or ())}) exists in this model but not in the checkpoint"
        elif b is None:
            detail = f"{fqn!r} (shape {list(a)}) exists in the checkpoint but not in this model"
        else:
            detail = f"{fqn!r} has shape {list(a)} in the checkpoint but {list(b)} in this model"
        raise CheckpointError(
            f"checkpoint {path} does not fit this model: parameter {detail}. The model arguments "
            f"(flavor or spec section overrides) differ from the run that wrote it; use the same arguments or "
            f"start fresh with --checkpoint.resume=never."
        )
