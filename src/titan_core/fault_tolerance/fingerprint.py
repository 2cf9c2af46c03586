"""What every replica group must agree on, and the one message when a group does not."""

from __future__ import annotations

from torch import nn

from ..config.job import JobConfig
from ..errors import ConfigError


def fingerprint(config: JobConfig, model_parts: list[nn.Module]) -> dict[str, str]:
    """The settings that make two groups' steps the same computation (plain strings: sent to peers)."""
    c, ft = config, config.fault_tolerance
    shapes = {k: str(tuple(v.shape)) for part in model_parts for k, v in part.state_dict().items()}
    return {
        "model.spec": str(c.model.spec), "model.flavor": c.model.flavor, "model.converters": ",".join(c.model.converters),
        "model shape": str(sorted(shapes.items())),
        "training.seed": str(c.training.seed), "training.seq_len": str(c.training.seq_len),
        "training.local_batch_size": str(c.training.local_batch_size),
        "training.global_batch_size": str(c.training.global_batch_size), "training.steps": str(c.training.steps),
        "optimizer": repr(c.optimizer.model_dump()), "lr_scheduler": repr(c.lr_scheduler.model_dump()),
        "data.source": c.data.source, "data.tokenizer": c.data.tokenizer,
        "fault_tolerance.group_size": str(ft.group_size), "fault_tolerance.semi_sync": ft.semi_sync,
        "fault_tolerance.sync_steps": str(ft.sync_steps), "fault_tolerance.outer_lr": str(ft.outer_lr),
        "fault_tolerance.outer_momentum": str(ft.outer_momentum),
        "fault_tolerance.average_inner_state": str(ft.average_inner_state),
    }


def _short(value: str) -> str:
    return value if len(value) <= 60 else value[:57] + "..."


def check_same_run(*, mine: dict[str, str], theirs: object, replica_id: int, peer: int) -> None:
    if not isinstance(theirs, dict):
        raise ConfigError(f"replica {replica_id}: replica {peer} sent no config fingerprint; it runs another version.")
    diffs = [f"{k} is {_short(mine[k])} here but {_short(str(theirs.get(k)))} in replica {peer}"
             for k in mine if str(theirs.get(k)) != mine[k]]
    if diffs:
        raise ConfigError(f"replica {replica_id} refused: its config differs from the live replicas' ({'; '.join(diffs)}). "
                          "Start every replica group with the same config.")
