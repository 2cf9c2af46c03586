"""Helpers for test_llama_parallel.py: a tiny Llama trained under a given layout.

``run_reference`` trains the plain model in this process; ``spawn`` trains the
same model in ``world_size`` gloo processes under each requested layout and
returns, per layout, the losses and how far the freshly initialized full state
dict is from the plain model's. Everything is float32 on CPU, one thread per
process.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from parallelize_helpers import parallel_kwargs, parallelize_alone
from torch import nn

from titan_core import CompileSection, ParallelDims, ParallelismSection, TrainingSection
from titan_llama.model import LlamaArgs, Transformer
from titan_llama.parallelize import parallelize_llama
from titan_llama.pipeline import pipeline_llama

ARGS = LlamaArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=128, multiple_of=32, max_seq_len=32)
SEQ_LEN = 32
GLOBAL_BATCH = 4
STEPS = 4
SEED = 3
# Plain SGD: unlike Adam it is not invariant to the gradient's scale, so a layout
# that sums instead of averaging (over ranks or microbatches) shows in the losses.
LR = 2.0


@dataclass(frozen=True)
class Layout:
    """One distributed configuration to train under (keyword dicts of the config sections)."""

    name: str
    parallelism: dict[str, Any]
    activation_checkpoint: dict[str, Any] = field(default_factory=dict)
    compile: bool = False


def init_model_weights(model_parts: list[nn.Module], *, seed: int) -> None:
    """Fill every parameter of every part as the plain model's ``init_weights(seed)`` would.

    Each parameter's full tensor is generated on CPU from a generator seeded by
    (seed, fqn), then only this rank's shard is kept: identical weights under
    any layout. (Candidate for ``titan_core.models.init.init_model_weights``.)
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    for part in model_parts:
        for fqn, param in part.named_parameters():
            generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(fqn.encode())) % 2**63)
            full = torch.empty(param.shape, dtype=torch.float32)
            part.init_parameter(fqn, full, generator)
            with torch.no_grad():
                if isinstance(param, DTensor):
                    # Every rank holds the same full tensor, so each slices its own
                    # shard locally (src_data_rank=None: no communication).
                    shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
                    param.to_local().copy_(shard.to_local())
                else:
                    param.copy_(full)
        part.init_buffers()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed random tokens [GLOBAL_BATCH, SEQ_LEN] and their next-token labels."""
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, ARGS.vocab_size, (GLOBAL_BATCH, SEQ_LEN + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the (micro)batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def _optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR)


def run_reference(activation_checkpoint: dict[str, Any] | None = None, steps: int = STEPS) -> list[float]:
    """Losses of the plain single-process model (optionally with activation checkpointing)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(ARGS)
    parallelize_alone(parallelize_llama, model, training=TrainingSection(seq_len=SEQ_LEN, local_batch_size=GLOBAL_BATCH),
                      parallelism=ParallelismSection(dp_shard=1), **(activation_checkpoint or {}))
    model.to_empty(device="cpu")
    init_model_weights([model], seed=SEED)
    opt = _optimizer(list(model.parameters()))
    tokens, labels = batch()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(tokens), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def reference_state_dict() -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        model = Transformer(ARGS)
    model.to_empty(device="cpu")
    model.init_weights(SEED)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train_layout(layout: Layout, world_size: int) -> dict[str, Any]:
    """Build, initialize and train ``layout`` on this rank; returns its losses and init error."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    parallelism = ParallelismSection(**layout.parallelism)
    dims = ParallelDims.resolve(
        dp_replicate=parallelism.dp_replicate, dp_shard=parallelism.dp_shard, tp=parallelism.tp,
        pp=parallelism.pp, world_size=world_size,
    )
    mesh = dims.build_mesh("cpu")
    local_batch = GLOBAL_BATCH // dims.dp
    training = TrainingSection(seq_len=SEQ_LEN, local_batch_size=local_batch)
    sections = parallel_kwargs(dims, mesh=mesh, training=training, parallelism=parallelism,
                               compile=CompileSection(enable=layout.compile), **layout.activation_checkpoint)
    with torch.device("meta"):
        model = Transformer(ARGS)

    schedule = None
    has_first = has_last = True
    stage_ids = [0]
    if dims.pp_enabled:
        result = pipeline_llama(
            model, parallel_dims=dims, mesh=mesh, parallelism=parallelism, training=training,
            device=torch.device("cpu"), loss_fn=loss_fn,
            parallelize=lambda part: parallelize_llama(part, **sections),
        )
        parts, schedule = result.model_parts, result.schedule
        has_first, has_last = result.has_first_stage, result.has_last_stage
        stage_ids = result.stage_ids
    else:
        parts = [parallelize_llama(model, **sections)]
    for part in parts:
        part.to_empty(device="cpu")
    init_model_weights(parts, seed=SEED)

    # Initial weights, gathered to full tensors, against the plain model's.
    reference = reference_state_dict()
    init_diff = 0.0
    n_checked = 0
    for part in parts:
        full = get_model_state_dict(part, options=StateDictOptions(full_state_dict=True))
        for key, value in full.items():
            init_diff = max(init_diff, (value - reference[key]).abs().max().item())
            n_checked += 1

    dp_rank = mesh["dp"].get_local_rank()
    tokens, labels = batch()
    tokens = tokens[dp_rank * local_batch:(dp_rank + 1) * local_batch]
    labels = labels[dp_rank * local_batch:(dp_rank + 1) * local_batch]
    use_loss_parallel = dims.tp_enabled and parallelism.loss_parallel
    opt = _optimizer([p for part in parts for p in part.parameters()])
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with loss_parallel() if use_loss_parallel else contextlib.nullcontext():
            if schedule is not None:
                mb_losses: list[torch.Tensor] = []
                schedule.step(
                    *([tokens] if has_first else []),
                    target=labels if has_last else None,
                    losses=mb_losses if has_last else None,
                    return_outputs=False,
                )
                loss = _local(torch.stack([_local(x) for x in mb_losses]).mean()) if has_last else torch.zeros(())
                # Only the last stage knows the loss: share it over the pipeline.
                loss = loss.detach().clone()
                dist.all_reduce(loss, group=mesh["pp"].get_group())
            else:
                loss = loss_fn(parts[0](tokens), labels)
                loss.backward()
                loss = _local(loss).detach().clone()
        opt.step()
        dist.all_reduce(loss, group=mesh["dp"].get_group())
        losses.append(loss.item() / dims.dp)
    is_dtensor = any(isinstance(p, DTensor) for part in parts for p in part.parameters())
    fqns = sorted(fqn for part in parts for fqn, _ in part.named_parameters())
    blocks = [block for part in parts for block in part.layers.values()]
    return {
        "losses": losses, "init_diff": init_diff, "n_checked": n_checked, "dtensor": is_dtensor, "fqns": fqns,
        "stage_ids": stage_ids,
        "checkpointed": sum(bool(getattr(b, "_titan_checkpointed", False)) for b in blocks),
        "compiled": sum(getattr(b, "_compiled_call_impl", None) is not None for b in blocks),
    }


def _local(t: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _worker(rank: int, world_size: int, init_file: str, layouts: list[Layout], out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    results: dict[str, Any] = {}
    try:
        for layout in layouts:
            try:
                results[layout.name] = _train_layout(layout, world_size)
            except Exception as exc:  # reported to the test, which fails with the message
                import traceback

                results[layout.name] = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
                raise
            dist.barrier()
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


def spawn(world_size: int, layouts: list[Layout]) -> list[dict[str, Any]]:
    """Train every layout in ``world_size`` processes; returns each rank's results."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.spawn(_worker, args=(world_size, init_file, layouts, tmp), nprocs=world_size, join=True)
        out = []
        for rank in range(world_size):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                out.append(json.load(f))
        return out
