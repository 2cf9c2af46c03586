"""The ``[fault_tolerance]`` section: torchft replica groups, the lighthouse, the local supervisor."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from .sections import Section

# Each local replica group is a whole training process (or nproc of them) on this one machine.
MAX_LOCAL_REPLICAS = 64


def lighthouse_problem(address: str) -> str:
    """Why ``address`` is not a lighthouse address ``http://HOST:PORT`` torchft can dial; "" when it is."""
    if any(c.isspace() or not c.isprintable() for c in address):
        return "it contains spaces or control characters"
    parts = urlsplit(address)
    if parts.scheme != "http":
        return "it does not start with http://"
    try:
        port = parts.port
    except ValueError:
        return "its port is not a number from 1 to 65535"
    if not parts.hostname:
        return "it names no host"
    if port is None or port == 0:
        return "it names no port (1 to 65535)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "it has a path, query or fragment after HOST:PORT"
    return ""


class FaultToleranceSection(Section):
    enable: bool = Field(False, description="Manage the data-parallel replicate dimension with torchft replica groups (needs titan-core[ft]).")
    replica_id: int = Field(0, ge=0, description="This replica group's index, 0..group_size-1; it picks the group's share of each global batch.")
    group_size: int = Field(1, ge=1, description="Number of replica groups the global batch is shared among.")
    min_replicas: int = Field(1, ge=1, description="Fewest live replica groups a step may commit with.")
    lighthouse: str = Field(
        "", description="Address of the torchft lighthouse, http://HOST:PORT (checked before the run starts); empty: the "
                        "TORCHFT_LIGHTHOUSE variable.")
    quorum_timeout_s: float = Field(
        30.0, gt=0, le=86400,
        description="Seconds to wait for a quorum, a slow group to join it, or a peer's state before giving up (at most 86400).")
    collective_timeout_s: float = Field(
        10.0, gt=0, le=86400,
        description="Seconds a cross-group collective may wait for the other groups before the step is retried; "
                    "a group lost mid-step holds the survivors at most this long (at most 86400).")
    local_replicas: int = Field(
        0, ge=0, le=MAX_LOCAL_REPLICAS,
        description="Local supervisor: start a lighthouse and this many replica groups on this machine (0: off; at most 64).")
    max_restarts: int = Field(3, ge=0, description="Local supervisor: restarts allowed per replica group before the run fails.")
    semi_sync: Literal["none", "diloco"] = Field("none", description="none: average gradients every step; diloco: local steps, an outer step every sync_steps.")
    sync_steps: int = Field(5, ge=1, description="DiLoCo: inner steps between two synchronisations of the groups.")
    outer_lr: float = Field(
        1.4, gt=0, description="DiLoCo: outer SGD learning rate on the averaged pseudo-gradient; about sqrt(groups) (docs/fault-tolerance.md).")
    outer_momentum: float = Field(
        0.0, ge=0, lt=1, description="DiLoCo: outer Nesterov momentum; the paper's 0.9 (with outer_lr 0.7) is for hundreds of inner steps.")
    average_inner_state: bool = Field(
        True, description="DiLoCo: at each sync also average the inner optimizer's moments over the groups "
                          "(3x the traffic of the pseudo-gradient alone with Adam); false: each group keeps its own.")
    save_replicas: Literal["all", "first"] = Field("all", description="Which replica groups save checkpoints: all, or only replica 0.")

    @field_validator("lighthouse")
    @classmethod
    def _lighthouse_address(cls, value: str) -> str:
        problem = lighthouse_problem(value) if value else ""
        if problem:
            raise ValueError(f"{value!r} is not a lighthouse address: {problem}. Write it as http://HOST:PORT "
                             "(e.g. http://10.0.0.1:29510), the address torchft_lighthouse listens on")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> FaultToleranceSection:
        if self.local_replicas:
            # The supervisor numbers its children itself; group_size follows the count.
            if self.group_size not in (1, self.local_replicas):
                raise ValueError(f"group_size={self.group_size} differs from local_replicas={self.local_replicas}; "
                                 "leave group_size unset with the local supervisor")
            object.__setattr__(self, "group_size", self.local_replicas)
        if self.semi_sync != "none" and not (self.enable or self.local_replicas):
            # Otherwise the run trains as one plain group and the setting silently does nothing.
            raise ValueError(f"semi_sync={self.semi_sync} synchronises replica groups, but there are none: set "
                             "fault_tolerance.enable=true (with a lighthouse) or fault_tolerance.local_replicas=K, "
                             "or leave semi_sync=none")
        if self.replica_id >= self.group_size:
            raise ValueError(f"replica_id={self.replica_id} is outside 0..{self.group_size - 1} (group_size={self.group_size})")
        if self.min_replicas > self.group_size:
            raise ValueError(f"min_replicas={self.min_replicas} is more than group_size={self.group_size}: no quorum could commit")
        return self
