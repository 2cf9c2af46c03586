"""Parallel degrees, validated against the world size before any process group exists."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from ..errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class _AboveOne:
    """A read-only flag of ParallelDims: whether the degree named ``degree`` is above 1 (that kind of
    parallelism is on; ``world_size``: more than one process)."""

    def __init__(self, degree: str) -> None:
        self.degree = degree

    @overload
    def __get__(self, dims: None, owner: type) -> _AboveOne: ...
    @overload
    def __get__(self, dims: ParallelDims, owner: type) -> bool: ...
    def __get__(self, dims: ParallelDims | None, owner: type) -> bool | _AboveOne:
        if dims is None:
            return self
        degree: int = getattr(dims, self.degree)
        return degree > 1


@dataclass(frozen=True)
class ParallelDims:
    """dp_replicate x dp_shard x cp x tp x pp = world_size; builds the named device mesh.

    Mesh dimension names: ``pp``, ``dp_replicate``, ``dp_shard``, ``tp``, and the
    flattened ``dp`` (all data-parallel ranks). Expert parallelism (``ep``) adds no
    ranks: it splits ``dp_shard`` into ``expert_dp_shard x ep`` (``expert_mesh``); with context
    parallelism, ``dp_shard x cp`` into ``expert_dp_shard x ep`` (the cp ranks join the ep group).
    Context parallelism (``cp`` > 1) adds a ``cp`` dimension between ``dp_shard`` and ``tp``:
    the cp ranks of one data-parallel rank read the same batch and each holds part of every
    sequence; FSDP2 shards over ``dp_shard x cp`` (flattened ``dp_shard_cp``), and the loss
    counts tokens over ``dp x cp`` (flattened ``dp_cp``). Without it the mesh stays 4-D, as before.
    """

    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    world_size: int
    ep: int = 1
    cp: int = 1

    @staticmethod
    def resolve(*, dp_replicate: int, dp_shard: int, tp: int, pp: int, world_size: int, ep: int = 1,
                cp: int = 1) -> ParallelDims:
        """Fill ``dp_shard=-1`` from the world size and check that the degrees multiply to it (and ep divides dp_shard)."""
        others = dp_replicate * cp * tp * pp
        named = f"dp_replicate={dp_replicate}" + (f" x cp={cp}" if cp > 1 else "") + f" x tp={tp} x pp={pp}"
        if dp_shard == -1:
            if world_size % others:
                raise ConfigError(
                    f"parallelism degrees do not fit the world size: {named} "
                    f"= {others} does not divide world size {world_size}. Change the degrees or the number of processes."
                )
            dp_shard = world_size // others
        if dp_shard < 1:
            raise ConfigError(f"parallelism.dp_shard must be -1 or >= 1, got {dp_shard}.")
        product = dp_shard * others
        if product != world_size:
            degrees = (f"dp_replicate={dp_replicate} x dp_shard={dp_shard}" + (f" x cp={cp}" if cp > 1 else "")
                       + f" x tp={tp} x pp={pp}")
            raise ConfigError(
                f"parallelism degrees do not fit the world size: {degrees} = {product}, but the world size is "
                f"{world_size}. Make the product equal the number of processes (dp_shard=-1 takes what the others "
                f"leave)."
            )
        if ep > 1:
            _check_ep(ep, dp_shard=dp_shard, cp=cp)
        return ParallelDims(dp_replicate, dp_shard, tp, pp, world_size, ep, cp)

    @property
    def dp(self) -> int:
        """Number of data-parallel ranks (each reads its own data shard)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_cp(self) -> int:
        """Ranks whose tokens differ: data-parallel ranks times context-parallel ranks (FSDP2 averages over these)."""
        return self.dp * self.cp

    fsdp_enabled = _AboveOne("dp_shard")
    cp_enabled = _AboveOne("cp")
    dp_replicate_enabled = _AboveOne("dp_replicate")
    ep_enabled = _AboveOne("ep")

    @property
    def expert_dp_shard(self) -> int:
        """The dp_shard ranks that hold the same experts under EP (FSDP2 shards those experts over them). With
        cp, the ep group is ``ep / cp`` dp_shard ranks times the cp ranks."""
        return self.dp_shard * self.cp // self.ep

    tp_enabled = _AboveOne("tp")
    pp_enabled = _AboveOne("pp")
    distributed = _AboveOne("world_size")

    def build_mesh(self, device_type: str) -> Any:
        """The named 4-D mesh (``mesh["dp"]`` also works, with a torch deprecation warning)."""
        return self.build_meshes(device_type)[0]

    def build_meshes(self, device_type: str) -> tuple[Any, Any]:
        """(the named 4-D mesh, the flattened 1-D data-parallel mesh); after the process group exists.

        The flattened ``dp`` mesh is what data loading and loss averaging use; it is
        returned rather than sliced from the root later, as torch asks.
        """
        from torch.distributed.device_mesh import init_device_mesh

        names: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "tp")
        shape: tuple[int, ...] = (self.pp, self.dp_replicate, self.dp_shard, self.tp)
        if self.cp_enabled:
            names, shape = (*names[:3], "cp", names[3]), (*shape[:3], self.cp, shape[3])
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        from ..runtime.torch_compat import flatten_mesh, unflatten_mesh  # start-up: config imports no torch

        dp = flatten_mesh(mesh[("dp_replicate", "dp_shard")], "dp")
        if self.cp_enabled:
            # Kept here, for dp_mesh and token_mesh: torch deprecates slicing a flattened dim from the root.
            dp_cp = flatten_mesh(mesh[("dp_replicate", "dp_shard", "cp")], "dp_cp")
            kept = {"dp_cp": dp_cp, "dp_shard_cp": flatten_mesh(mesh[("dp_shard", "cp")], "dp_shard_cp")}
            if self.dp_replicate_enabled:  # HSDP's 2-D mesh: dp_cp split again, on the same root
                kept["dp_replicate, dp_shard_cp"] = unflatten_mesh(
                    dp_cp, "dp_cp", (self.dp_replicate, self.dp_shard * self.cp), ("dp_replicate", "dp_shard_cp"))
            _FLATTENED[mesh] = kept
        return mesh, dp

    def token_mesh(self, mesh: DeviceMesh, dp_mesh: DeviceMesh) -> DeviceMesh:
        """The ranks whose tokens differ (``dp`` with ``cp`` folded in): valid labels and MoE loads add up over it."""
        return _flattened(mesh, "dp_cp") if self.cp_enabled else dp_mesh

    def expert_meshes(self, mesh: DeviceMesh, *, with_tp: bool = False) -> tuple[DeviceMesh, DeviceMesh]:
        """(the ``ep`` mesh the experts are split over, the mesh FSDP2 shards each rank's experts over).
        ``with_tp`` (expert tensor parallelism as well): the first is the 2-D ``(ep, tp)`` mesh.

        ``dp_shard`` unflattened into ``(expert_dp_shard, ep)``, ``ep`` innermost: an EP group
        is ``ep`` consecutive dp_shard ranks (on one machine when it can be), within one tp slice
        and one pipeline stage: tp ranks route the same tokens, so each slice exchanges its own
        (the experts are replicated over tp). The expert FSDP2 mesh is
        ``(dp_replicate, expert_dp_shard)`` for HSDP, else ``expert_dp_shard``. Both come from
        the same root mesh as ``dp_mesh``, as FSDP2 requires of a parameter sharded on two meshes.
        Creates process groups: every rank calls it, once per model part.

        With context parallelism the cp ranks of one data-parallel rank hold different tokens of the same
        sequences, and they join the ep group (as torchtitan does): ``dp_shard`` splits into
        ``(expert_dp_shard, ep / cp)``, and ``ep`` is ``(ep / cp, cp)`` flattened. The experts' FSDP2 mesh
        then stays the outer ``expert_dp_shard`` dim, in the mesh's order.
        """
        from ..runtime.torch_compat import flatten_mesh, unflatten_mesh  # start-up: as in build_meshes

        if self.cp_enabled:
            split = unflatten_mesh(mesh, "dp_shard", (self.expert_dp_shard, self.ep // self.cp),
                                   ("expert_dp_shard", "ep_shard"))
            if with_tp:  # (ep, tp): (ep_shard, cp, tp) flattened, then split again into (ep, tp), on the same root
                ep_tp = flatten_mesh(split[("ep_shard", "cp", "tp")], "ep_tp")
                split_over = unflatten_mesh(ep_tp, "ep_tp", (self.ep, self.tp), ("ep", "tp"))
            else:
                split_over = flatten_mesh(split[("ep_shard", "cp")], "ep")
        else:
            split = unflatten_mesh(mesh, "dp_shard", (self.expert_dp_shard, self.ep), ("expert_dp_shard", "ep"))
            split_over = split[("ep", "tp")] if with_tp else split["ep"]
        if self.dp_replicate_enabled:
            return split_over, split[("dp_replicate", "expert_dp_shard")]
        return split_over, split["expert_dp_shard"]

    def dp_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The mesh FSDP2 / replication uses: (dp_replicate, dp_shard) for HSDP, else 1-D; with cp, dp_shard_cp
        in place of dp_shard (the cp ranks hold the same weights and see different tokens)."""
        if self.cp_enabled:
            return _flattened(mesh, "dp_replicate, dp_shard_cp" if self.dp_replicate_enabled else "dp_shard_cp")
        if self.dp_replicate_enabled and self.fsdp_enabled:
            return mesh[("dp_replicate", "dp_shard")]
        if self.dp_replicate_enabled:
            return mesh["dp_replicate"]
        return mesh["dp_shard"]


# The flattened meshes build_meshes made, by root mesh. DeviceMesh compares by layout and names, so a root
# built again with the same layout replaces the entry; the kept meshes refer to their root, so an entry lives
# as long as the process's process groups do.
_FLATTENED: weakref.WeakKeyDictionary[DeviceMesh, dict[str, DeviceMesh]] = weakref.WeakKeyDictionary()


def _flattened(mesh: DeviceMesh, name: str) -> DeviceMesh:
    """The mesh ``name`` that build_meshes kept for the root ``mesh``; for a root built elsewhere (a spec's own
    mesh), sliced from it by name, as torch still allows (with its deprecation warning)."""
    kept = _FLATTENED.get(mesh)
    if kept is not None:
        return kept[name]
    return mesh[tuple(name.split(", "))] if ", " in name else mesh[name]


def _check_ep(ep: int, *, dp_shard: int, cp: int = 1) -> None:
    """EP groups are carved out of the dp_shard ranks (within one tp slice and one pipeline stage); with cp,
    out of the dp_shard x cp ranks, every cp rank of a data-parallel rank in the same group."""
    if cp > 1:
        if ep % cp or dp_shard % (ep // cp):
            raise ConfigError(
                f"parallelism.ep={ep} with parallelism.cp={cp}: the cp ranks of a data-parallel rank exchange their "
                f"tokens within one expert-parallel group, so ep is cp times a divisor of dp_shard={dp_shard} "
                f"(ep = {' or '.join(str(cp * k) for k in range(1, dp_shard + 1) if dp_shard % k == 0)})."
            )
        return
    if dp_shard % ep:
        raise ConfigError(
            f"parallelism.ep={ep} does not divide the data-parallel shard degree dp_shard={dp_shard}: the "
            f"expert-parallel groups are carved out of the dp_shard ranks (dp_shard = ep x the ranks each expert "
            f"is FSDP-sharded over). Choose an ep that divides {dp_shard}, or launch a multiple of {ep} "
            f"data-parallel processes."
        )
