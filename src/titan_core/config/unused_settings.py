"""Settings given a value that does nothing in this configuration: one warning line each.

``--optimizer.muon_ns_steps=3`` under AdamW, ``--ema.interval=10`` with no EMA, ``--lr_scheduler.decay_ratio``
with a cosine decay: each was accepted and ignored without a word, so a run that meant to use it trained
without it. A warning, not an error: a config file may keep settings for a feature it turns on and off
(``wandb_project`` beside ``wandb = false``). Only values other than the default are named, so a saved
``config.toml`` given back as ``--config`` (every field written out) says nothing about what it merely carries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from .job import JobConfig


@dataclass(frozen=True)
class _Idle:
    section: str
    keys: tuple[str, ...]
    idle: Callable[[JobConfig], str | None]  # why the keys do nothing here (a clause), or None when they act


def _unless(active: bool, why: str) -> str | None:
    return None if active else why


_RULES: tuple[_Idle, ...] = (
    _Idle("optimizer", ("muon_momentum", "muon_nesterov", "muon_ns_steps"),
          lambda c: _unless(c.optimizer.name == "Muon", f"with optimizer.name={c.optimizer.name} (Muon only)")),
    _Idle("optimizer", ("betas", "eps"),
          lambda c: _unless(c.optimizer.name != "SGD", "with optimizer.name=SGD (Adam, AdamW and Muon only)")),
    _Idle("ema", ("interval",), lambda c: _unless(c.ema.decay is not None, "without ema.decay (no EMA is kept)")),
    _Idle("lr_scheduler", ("decay_ratio", "wsd_decay_shape"),
          lambda c: _unless(c.lr_scheduler.decay_type == "wsd",
                            f"with lr_scheduler.decay_type={c.lr_scheduler.decay_type} (wsd only)")),
    _Idle("lr_scheduler", ("min_lr_factor",),
          lambda c: _unless(c.lr_scheduler.decay_type != "constant", "with lr_scheduler.decay_type=constant")),
    _Idle("activation_checkpoint", ("selective_every", "selective_save_ops"),
          lambda c: _unless(c.activation_checkpoint.mode == "selective",
                            f"with activation_checkpoint.mode={c.activation_checkpoint.mode} (selective only)")),
    _Idle("activation_checkpoint", ("selective_save_ops",),
          lambda c: _unless(c.activation_checkpoint.mode != "selective" or not c.activation_checkpoint.selective_every,
                            f"with activation_checkpoint.selective_every={c.activation_checkpoint.selective_every} "
                            f"(whole blocks are checkpointed; the ops list is per-op selective's, selective_every=0)")),
    _Idle("stability", ("spike_window", "spike_sigmas", "spike_min_steps"),
          lambda c: _unless(c.stability.spike_guard, "without stability.spike_guard=true")),
    _Idle("checkpoint", ("interval", "keep_latest_k", "async_mode", "allow_converter_change", "allow_data_change"),
          lambda c: _unless(c.checkpoint.enable, "without checkpoint.enable=true")),
    _Idle("checkpoint", ("export_dtype", "export_format", "export_shard_gb", "export_weights"),
          lambda c: _unless(c.checkpoint.export_at_end, "without checkpoint.export_at_end=true")),
    _Idle("validation", ("freq", "steps"), lambda c: _unless(c.validation.enable, "without validation.enable=true")),
    _Idle("eval", ("interval", "limit", "batch_size", "weights"),
          lambda c: _unless(bool(c.eval.tasks), "without eval.tasks (nothing is scored)")),
    _Idle("profiling", ("start_step", "steps", "folder", "record_shapes", "memory_snapshot", "memory_snapshot_entries"),
          lambda c: _unless(c.profiling.enable, "without profiling.enable=true")),
    _Idle("metrics", ("wandb_project",), lambda c: _unless(c.metrics.wandb, "without metrics.wandb=true")),
)


def _non_default(section: BaseModel, key: str) -> bool:
    field = type(section).model_fields[key]
    default = field.get_default(call_default_factory=True)
    return key in section.model_fields_set and getattr(section, key) != default


def idle_settings(config: JobConfig) -> list[str]:
    """One line per section rule whose keys were given non-default values that this configuration never reads."""
    lines = []
    for rule in _RULES:
        section = getattr(config, rule.section)
        given = [f"{rule.section}.{key}={getattr(section, key)!r}" for key in rule.keys if _non_default(section, key)]
        why = rule.idle(config) if given else None
        if why is not None:
            lines.append(f"warning: {', '.join(given)} {'does' if len(given) == 1 else 'do'} nothing {why}")
    return lines


__all__ = ["idle_settings"]
