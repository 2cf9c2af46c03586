"""Worker processes for tests/test_checkpoint.py (run as a script, one process per rank).

    python tests/_checkpoint_worker.py fsdp <run_dir>    # under 2 ranks (RANK/WORLD_SIZE/MASTER_* set)
    python tests/_checkpoint_worker.py pp <run_dir>      # under 2 ranks: one pipeline stage each
    python tests/_checkpoint_worker.py pause <run_dir>   # single process, saves steps 1 and 2 (2 pauses)

``fsdp``: load the single-process checkpoint ``single/step-000002`` (written by the
test) under FSDP2 and record the full weights it sees, train one step, save
step 3 synchronously and step 4 asynchronously, and record the full model and
optimizer state at each save, for the test to compare after loading in one process;
then make rank 1's disk "full" and record what each rank saw.
"""

from __future__ import annotations

import copy
import errno
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from titan_core.checkpoint import CheckpointManager, RunIdentity, collect_param_shapes, export_safetensors
from titan_core.checkpoint.storage import IndexedWriter
from titan_core.config.sections import CheckpointSection
from titan_core.errors import CheckpointError


class Position:
    """A data-loader stand-in: a global stream position, the same on every rank."""

    def __init__(self) -> None:
        self.sample = 0

    def state_dict(self) -> dict[str, int]:
        return {"sample": self.sample}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sample = int(state["sample"])


def build() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, Position]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler, Position()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: object, step: int) -> None:
    data = torch.Generator().manual_seed(100 + step)
    x = torch.randn(4, 6, generator=data)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()  # type: ignore[attr-defined]


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, object]:
    """Full (gathered) copies; a collective. Cloned: DCP hands out the live ``step`` tensors."""
    opts = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    states = {
        "model": get_model_state_dict(model, options=opts),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=opts),
    }
    return {name: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
            for name, sd in states.items()}


def fsdp(run_dir: Path) -> None:
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer, scheduler, position = build()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    identity = RunIdentity("tiny", "debug", (), collect_param_shapes([model]))

    def manager(folder: str, resume: str, async_mode: str = "disabled") -> CheckpointManager:
        config = CheckpointSection(enable=True, interval=1, folder=folder, resume=resume, async_mode=async_mode,
                                   keep_latest_k=0)
        return CheckpointManager(config=config, run_dir=run_dir, model_parts=[model], optimizer=optimizer,
                                 lr_schedulers=scheduler, dataloader=position, identity=identity, is_rank0=rank == 0)

    info = manager("single", "auto").resume()
    assert info is not None and info.step == 2, info
    loaded = full_state(model, optimizer)
    if rank == 0:
        torch.save({"step": info.step, "sample": position.sample, "last_epoch": scheduler.last_epoch, **loaded},
                   run_dir / "fsdp_loaded.pt")

    sync = manager("multi", "never")
    train_step(model, optimizer, scheduler, 3)
    position.sample = 30
    sync.maybe_save(3, tokens_seen=300)
    reference = full_state(model, optimizer)
    if rank == 0:
        torch.save(reference, run_dir / "fsdp_step3.pt")

    background = manager("multi_async", "never", async_mode="async")
    train_step(model, optimizer, scheduler, 4)
    position.sample = 40
    background.maybe_save(4, tokens_seen=400)
    reference = full_state(model, optimizer)
    train_step(model, optimizer, scheduler, 5)  # mutates the weights while the save runs
    background.wait()
    if rank == 0:
        torch.save(reference, run_dir / "fsdp_step4.pt")
    export_safetensors([model], run_dir / "export" / "model.safetensors", dtype=torch.bfloat16, is_rank0=rank == 0)
    final = full_state(model, optimizer)["model"]  # a collective: every rank takes part
    if rank == 0:
        torch.save(final, run_dir / "fsdp_step5_model.pt")

    # Only rank 1's disk is full: both ranks must fail with the same error, neither may hang.
    if rank == 1:
        def full_disk(self: IndexedWriter, *args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

        IndexedWriter.write_data = full_disk  # type: ignore[method-assign]
    for name, ckpt in (("sync", sync), ("async", background)):
        try:
            ckpt.maybe_save(6, tokens_seen=600)
            ckpt.wait()
            outcome = "saved"
        except CheckpointError as exc:
            outcome = str(exc)
        (run_dir / f"fault_{name}_rank{rank}.txt").write_text(outcome)
    dist.barrier()
    dist.destroy_process_group()


def pp(run_dir: Path) -> None:
    """Two pipeline ranks, each holding one stage (disjoint fqns) with its own optimizer."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, _, _, position = build()
    part = copy.deepcopy(model)
    for name in (["2"] if rank == 0 else ["0", "1"]):
        del part._modules[name]
    optimizer = torch.optim.AdamW(part.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    for p in part.parameters():  # a deterministic stand-in for the pipeline backward
        p.grad = torch.full_like(p, 0.5)
    optimizer.step()
    scheduler.step()
    position.sample = 11
    identity = RunIdentity("tiny", "debug", (), collect_param_shapes([part]))
    config = CheckpointSection(enable=True, interval=1, folder="pp")
    ckpt = CheckpointManager(config=config, run_dir=run_dir, model_parts=[part], optimizer=optimizer,
                             lr_schedulers=scheduler, dataloader=position, identity=identity, is_rank0=rank == 0)
    ckpt.maybe_save(1, tokens_seen=5)
    torch.save(full_state(part, optimizer), run_dir / f"pp_rank{rank}.pt")
    export_safetensors([part], run_dir / "pp_export" / "model.safetensors", dtype=torch.float32, is_rank0=rank == 0)
    dist.barrier()
    dist.destroy_process_group()


def pause(run_dir: Path) -> None:
    from checkpoint_pause import install

    install(at_step=2, pause_file=run_dir / "paused", seconds=120)
    model, optimizer, scheduler, position = build()
    identity = RunIdentity("tiny", "debug", (), collect_param_shapes([model]))
    config = CheckpointSection(enable=True, interval=1, keep_latest_k=0)
    ckpt = CheckpointManager(config=config, run_dir=run_dir, model_parts=[model], optimizer=optimizer,
                             lr_schedulers=scheduler, dataloader=position, identity=identity, is_rank0=True)
    for step in (1, 2):
        train_step(model, optimizer, scheduler, step)
        ckpt.maybe_save(step, tokens_seen=10 * step)
    ckpt.wait()
    print("finished without pausing", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    scenario, folder = sys.argv[1], Path(sys.argv[2])
    {"fsdp": fsdp, "pp": pp, "pause": pause}[scenario](folder)
    os._exit(0)  # skip interpreter teardown of the gloo groups (slow and noisy)
