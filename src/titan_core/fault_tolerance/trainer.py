"""The Trainer of one replica group: every step follows the torchft quorum.

Per step: join the quorum (a group that is behind loads a live peer's state first) ->
forward/backward on this group's share of the global batch -> average gradients
over the live groups -> clip -> commit (torchft's should_commit) -> optimizer step.
A step that does not commit (a peer died mid-step) is retried from the same data
position, so a committed step never reads a window twice; the windows of a group
that is down are the only ones skipped.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from ..checkpoint import Stateful
from ..errors import ConfigError, LighthouseLost, NothingToRejoin, TitanError
from ..train.grad_norm import clip_grad_norm
from ..train.trainer import StepResult, Trainer
from .diloco import DILOCO, OuterState, OuterStep, inner_state
from .fingerprint import check_same_run, fingerprint
from .rehearsal import absent_windows, short_step_seconds
from .replica import RESTARTED_ENV, ReplicaGroup
from .shards import local, local_tree, redistribute_optimizer_state

# Uncommitted attempts of one step before the group gives up (each one already waited a quorum).
MAX_STEP_ATTEMPTS = 20


def status(line: str) -> None:
    """A line the local supervisor reads (membership changes); also readable by a person."""
    print(f"[ft-status] {line}", file=sys.stdout, flush=True)


class FaultTolerantTrainer(Trainer):
    """A Trainer whose data-parallel replicate dimension is the set of live torchft replica groups."""

    def init_distributed(self) -> None:
        super().init_distributed()
        ft = self.config.fault_tolerance
        self.ft = ft
        self.replica = ReplicaGroup(ft, group_rank=self.proc.rank, group_world_size=self.proc.world_size,
                                    state_dict=self.live_state, load_state_dict=self.load_live_state)
        self.manager_synced = False
        self.manager_joined = False  # after this group's first quorum
        self.absent = absent_windows()
        self.short_step_s = short_step_seconds()
        self.last_participants = 0
        self.rejoined_from: int | None = None

    def build_optimizers(self) -> None:
        super().build_optimizers()

        self.outer = (OuterStep(self.model_parts, lr=self.ft.outer_lr, momentum=self.ft.outer_momentum,
                                sync_steps=self.ft.sync_steps) if self.ft.semi_sync == "diloco" else None)

    def extra_states(self) -> dict[str, Stateful]:
        # DiLoCo's checkpoints hold the outer state too, so a resume between two syncs is exact.
        return {DILOCO: OuterState(self.outer)} if self.outer is not None else {}

    def data_shard(self) -> tuple[int, int]:
        # Group g's ranks read shares g*dp .. g*dp+dp-1 of a global batch shared by every group's ranks.
        rank, shares = super().data_shard()
        return self.ft.replica_id * shares + rank, self.ft.group_size * shares

    def build_checkpointer(self) -> None:
        if self.ft.save_replicas == "first" and self.ft.replica_id != 0:
            # Only replica 0 saves; this group resumes by healing from a live peer instead.
            self.config.checkpoint.enable = False
        super().build_checkpointer()

    # ---- the state a rejoining group receives from a live peer -----------------------------------
    def live_state(self) -> dict[str, Any]:
        return {
            "model": [{k: local(v) for k, v in part.state_dict().items()} for part in self.model_parts],
            "optimizer": local_tree(self.optimizer.state_dict()),
            "lr_schedulers": self.lr_schedulers.state_dict(),
            "data": self.dataloader.state_dict(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "outer": self.outer.state_dict() if self.outer is not None else {},
            "replica_id": self.ft.replica_id,
            "fingerprint": fingerprint(self.config, self.model_parts),
        }

    def load_live_state(self, state: dict[str, Any]) -> None:
        check_same_run(mine=fingerprint(self.config, self.model_parts), theirs=state["fingerprint"],
                       replica_id=self.ft.replica_id, peer=int(state["replica_id"]))
        for part, sd in zip(self.model_parts, state["model"]):
            with torch.no_grad():
                for name, value in part.state_dict().items():
                    local(value).copy_(sd[name])
        self.optimizer.load_state_dict(state["optimizer"])
        redistribute_optimizer_state(getattr(self.optimizer, "optimizers", []))
        self.lr_schedulers.load_state_dict(state["lr_schedulers"])
        self.dataloader.load_state_dict(state["data"])
        if self.outer is not None:
            self.outer.load_state_dict(state["outer"])
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.rejoined_from = int(state["replica_id"])

    def set_aside_later_metrics(self) -> None:
        """Nothing here: deferred to ``join_quorum``. Only at its first quorum does a group learn the step it
        trains on from (its own, or a live peer's when it is behind). A restarted group continues at its peer's
        step: the records of its earlier life are committed steps nobody trains again, and they stay in
        metrics.jsonl."""

    # ---- one step ---------------------------------------------------------------------------------
    def status(self, line: str) -> None:
        if self.is_rank0:  # every rank of a group sees the same membership: one line per group
            status(line)

    def join_quorum(self) -> None:
        if not self.manager_synced:  # after a resume the quorum must see this group's real step
            self.replica.set_step(self.step)
            self.manager_synced = True
            if self.outer is not None:  # the weights may have been loaded since the optimizers were built
                self.outer.restart_from_model(self.step)
        try:
            self.replica.start_step()
        except ConfigError:
            raise
        except Exception as exc:  # torchft raises whatever its RPC layer raised
            raise LighthouseLost(
                f"replica {self.ft.replica_id}: no quorum at step {self.step + 1}: the lighthouse "
                f"({self.ft.lighthouse or 'TORCHFT_LIGHTHOUSE'}) did not answer within fault_tolerance.quorum_timeout_s="
                f"{self.ft.quorum_timeout_s:g}s ({type(exc).__name__}). Restart the lighthouse, then this group: it "
                "resumes from its last checkpoint."
            ) from exc
        if not self.manager_joined:
            self.manager_joined = True
            if os.environ.get(RESTARTED_ENV) and self.rejoined_from is None and self.replica.participants <= 1:
                self.status(f"step {self.step + 1} nothing-to-rejoin {self.ft.replica_id}")
                raise NothingToRejoin("no live replica group to rejoin")
            if self.is_rank0 and not os.environ.get(RESTARTED_ENV):
                super().set_aside_later_metrics()  # the records past the step this group now trains on from
        if self.rejoined_from is not None:
            if self.is_rank0:
                super().set_aside_later_metrics()  # only records past its peer's step (normally none)
            self.status(f"step {self.step + 1} rejoined {self.ft.replica_id} from {self.rejoined_from}")
            self.rejoined_from = None

    def train_step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> StepResult:
        for _ in range(MAX_STEP_ATTEMPTS):
            self.join_quorum()
            data_state = self.dataloader.state_dict()  # taken after a heal: the step's start position
            result = self.attempt_step(batches)
            if result is not None:
                n = self.replica.participants
                if n != self.last_participants:
                    self.status(f"step {self.step + 1} participants {n} of {self.ft.group_size}")
                    self.last_participants = n
                if n < self.ft.group_size and self.short_step_s:
                    time.sleep(self.short_step_s)  # test-only (rehearsal.py): hold the run while a group is down
                return result
            self.dataloader.load_state_dict(data_state)  # not committed: the same windows again
            time.sleep(0.1)
        raise TitanError(f"replica {self.ft.replica_id}: step {self.step + 1} did not commit in {MAX_STEP_ATTEMPTS} "
                         f"attempts (last error: {self.replica.errored()}).")

    def attempt_step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> StepResult | None:
        if self.outer is None:
            return self.attempt_sync_step(batches)
        return self.attempt_diloco_step(batches)

    def attempt_diloco_step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> StepResult | None:
        """An inner step on this group's data; every sync_steps, the outer step over the live groups.

        The quorum still runs every step, so a restarted group rejoins at the next step. The groups
        agree on should_commit, so when a group dies during a sync every group skips that outer
        step alike (the inner step stands) and the next sync averages the longer stretch."""
        assert self.outer is not None
        sync = (self.step + 1) % self.ft.sync_steps == 0
        self.optimizer.zero_grad()
        loss = self.step_forward_backward(batches)  # per valid token of this group's share
        grad_norm = clip_grad_norm(self.model_parts, self.config.training.max_norm, pp_group=None)
        group_loss = self.global_average_loss(loss)
        if not sync and not self.replica.commit():
            return None  # nothing applied yet: the step is tried again
        if not (math.isfinite(group_loss) and math.isfinite(grad_norm)):
            return self.handle_nonfinite(group_loss, grad_norm)
        self.optimizer.step()
        self.moe.after_step()  # as the plain step does (see attempt_sync_step)
        self.loss_terms.after_step()  # the model's own loss terms: this group's figures
        self.lr_schedulers.step()
        if sync:
            # The inner optimizer's moments are averaged too (into copies: applied only if the sync commits):
            # each group's Adam then resumes from the groups' common momentum, not its own noisier one. So are
            # the MoE routing biases, which each group moved from its own tokens since the last sync: they
            # are buffers, not parameters, so the outer step would leave every group its own.
            inner = [t.clone() for t in inner_state(self.optimizer)] if self.ft.average_inner_state else []
            biases = [block.router.expert_bias.clone() for block in self.moe.blocks]
            self.replica.average([*self.outer.pseudo_gradients(), *inner, *biases])
            if self.replica.commit():
                self.outer.step(self.step + 1)
                with torch.no_grad():
                    for mine, mean in zip(inner_state(self.optimizer), inner):
                        mine.copy_(mean)
                    for block, mean in zip(self.moe.blocks, biases):
                        block.router.expert_bias.copy_(mean)
        return StepResult(group_loss, grad_norm, skipped=False)

    def attempt_sync_step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> StepResult | None:
        """One try at the step; None when the live groups did not all finish it (nothing was changed)."""
        self.optimizer.zero_grad()
        loss = self.step_forward_backward(batches)  # per valid token of this group's share
        grads = [local(p.grad) for part in self.model_parts for p in part.parameters() if p.grad is not None]
        group_loss = torch.tensor([self.global_average_loss(loss)], dtype=torch.float32)
        # MoE tokens per expert, averaged over the groups with the gradients: every group then moves its
        # routing biases by the same update, from all groups' tokens, and the groups' weights stay identical.
        group_counts = self.moe.step_counts()
        counts = [group_counts.float()] if group_counts is not None else []
        absent = self.absent.get(self.step + 1, set())  # empty but in the test-only rehearsal
        if self.ft.replica_id in absent:
            for t in [*grads, group_loss, *counts]:
                t.zero_()
        self.replica.average([*grads, *counts], absent=len(absent))
        grad_norm = clip_grad_norm(self.model_parts, self.config.training.max_norm, pp_group=None)
        self.replica.average([group_loss], absent=len(absent))
        if not self.replica.commit():
            return None
        global_loss = float(group_loss)
        if not (math.isfinite(global_loss) and math.isfinite(grad_norm)):
            return self.handle_nonfinite(global_loss, grad_norm)
        self.optimizer.step()
        # MoE routing-bias update and load figures, as Trainer.train_step does, from the averaged counts (the
        # mean over groups: the update depends on load ratios only); the bias travels with the weights to a
        # group that heals.
        self.moe.after_step(counts=counts[0] if counts else None)
        self.loss_terms.after_step()  # the model's own loss terms: this group's figures
        self.lr_schedulers.step()
        return StepResult(global_loss, grad_norm, skipped=False)

    def step_metrics(self) -> dict[str, float]:
        return {"ft_replicas": self.replica.participants}  # the replica groups that committed this step

    def finish(self) -> None:
        super().finish()
        self.replica.shutdown()
