"""``[eval]`` during training: the tasks, read and tokenized at start-up, scored every
``eval.interval`` steps and at the last one, on the weights ``Trainer.evaluation_weights`` gives
(the training weights; a subclass or an EMA hands others), in eval mode, under no_grad.

The Trainer calls ``build_evaluation`` from its set-up and ``maybe_evaluate`` after each step;
the work is here so the loop keeps one line for it. The figures go to the metrics records
(``eval/<task>/acc``, ...: metrics.jsonl, TensorBoard, W&B) and so to titan-report's charts.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ..boundary.plugin_boundary import SpecCalls
from ..config.job import JobConfig
from ..config.parallel_dims import ParallelDims
from ..console import progress
from ..evaluation import Forward, PreparedTask, ScoreLayout, evaluate, format_results, load_tasks, prepare_tasks
from ..plan.resolve import ResolvedConfig
from ..plugin.protocols import Tokenizer
from ..plugin.spec_factories import MetricsProcessor


class Trainer(Protocol):
    """What the evaluation reads of the Trainer (trainer.py), named here so neither file imports the other."""

    config: JobConfig
    resolved: ResolvedConfig
    calls: SpecCalls
    tokenizer: Tokenizer
    metrics: MetricsProcessor
    dims: ParallelDims
    device: torch.device
    dp_rank: int
    dp_flat_mesh: Any
    mesh: Any
    pipeline: Any  # parallel.pipeline.PipelineResult under pipeline parallelism, else None
    is_rank0: bool
    step: int

    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...
    def evaluation_weights(self) -> contextlib.AbstractContextManager[list[nn.Module]]: ...


@dataclass(frozen=True)
class TrainingEvaluation:
    tasks: list[PreparedTask]
    window: int  # tokens the model reads at once
    interval: int
    batch_size: int

    def due(self, step: int, *, last: bool) -> bool:
        return bool(self.tasks) and (step % self.interval == 0 or last)


def model_window(model_args: Any, seq_len: int) -> int:
    """The positions a forward may hold: the model's ``max_seq_len`` (its rotary table) when it has one."""
    limit = getattr(model_args, "max_seq_len", None)
    return limit if isinstance(limit, int) and limit > 0 else seq_len


def build_training_evaluation(trainer: Trainer) -> TrainingEvaluation:
    """The run's tasks, checked and tokenized (a bad file stops the run here, before the model is built)."""
    e = trainer.config.eval
    window = model_window(trainer.resolved.model_args, trainer.config.training.seq_len)
    tasks = [t.limited(e.limit) for t in load_tasks(e.tasks)]
    prepared = prepare_tasks(tasks, trainer.tokenizer, window=window)
    if tasks:
        sizes = ", ".join(f"{t.name} ({len(t.examples)} {t.kind.replace('_', '-')})" for t in tasks)
        progress(f"eval: {sizes}, every {e.interval} steps and at the end", is_rank0=trainer.is_rank0)
    return TrainingEvaluation(prepared, window, e.interval, e.batch_size)


def forward_of(trainer: Trainer, part: nn.Module) -> Forward:
    """The model's logits as a plain tensor (a vocab-sharded DTensor under TP is gathered)."""

    def forward(inputs: torch.Tensor) -> torch.Tensor:
        with trainer.autocast():
            logits = trainer.calls.forward(part, inputs)
        return logits.full_tensor() if isinstance(logits, DTensor) else logits

    return forward


# The dtypes a pipeline stage may hand on, by index (the header of each point-to-point send carries the index).
_STREAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_HEADER = 8  # int64 values: ndim, up to 6 sizes, the dtype's index


def pipeline_forward_of(trainer: Trainer, parts: list[nn.Module]) -> Forward:
    """Under pipeline parallelism: the stages in order, each on the rank that holds it, the residual stream
    handed to the next stage's rank by a point-to-point send over the pp group (a header with its shape and
    dtype first: an evaluation batch has its own width). The logits exist on the last stage's rank; the
    others get None and add zeros to the scores (``ScoreLayout.stage_group``).

    Forward only, one batch at a time: the stages take turns rather than overlap, which costs time but
    needs no schedule (torch's schedules split batches into micro-batches of a fixed count, and their
    forward-only pass returns losses, not the log-probabilities the tasks score)."""
    pipe = trainer.pipeline
    assert pipe is not None
    group = trainer.mesh["pp"].get_group()
    me = dist.get_rank(group)
    held: list[list[int]] = [[] for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(held, list(pipe.stage_ids), group=group)
    owner = {stage: rank for rank, stages in enumerate(held) for stage in stages}
    module = dict(zip(pipe.stage_ids, parts))
    last = max(owner)

    def send(stream: torch.Tensor, stage: int) -> None:
        to = dist.get_global_rank(group, owner[stage])
        header = torch.zeros(_HEADER, dtype=torch.long, device=stream.device)
        header[0] = stream.dim()
        header[1:1 + stream.dim()] = torch.tensor(stream.shape, dtype=torch.long)
        header[-1] = _STREAM_DTYPES.index(stream.dtype)
        dist.send(header, dst=to, group=group)
        dist.send(stream.contiguous(), dst=to, group=group)

    def receive(stage: int) -> torch.Tensor:
        frm = dist.get_global_rank(group, owner[stage])
        header = torch.zeros(_HEADER, dtype=torch.long, device=trainer.device)
        dist.recv(header, src=frm, group=group)
        ndim = int(header[0])
        stream = torch.empty([int(n) for n in header[1:1 + ndim]], dtype=_STREAM_DTYPES[int(header[-1])],
                             device=trainer.device)
        dist.recv(stream, src=frm, group=group)
        return stream

    def forward(inputs: torch.Tensor) -> torch.Tensor | None:
        stream: torch.Tensor | None = inputs
        for stage in range(last + 1):
            if owner[stage] != me:
                continue
            if stage > 0 and owner[stage - 1] != me:
                stream = receive(stage - 1)
            with trainer.autocast():
                stream = module[stage](stream)
            if stage < last and owner[stage + 1] != me:
                send(stream.to_local() if isinstance(stream, DTensor) else stream, stage + 1)
        if owner[last] != me:
            return None
        assert stream is not None
        return stream.full_tensor() if isinstance(stream, DTensor) else stream

    return forward


@torch.no_grad()
def run_training_evaluation(trainer: Trainer, evaluation: TrainingEvaluation) -> dict[str, float]:
    """Score every task on ``trainer.evaluation_weights()``; log the figures on rank 0."""
    dims = trainer.dims
    layout = ScoreLayout(trainer.dp_rank, dims.dp, trainer.dp_flat_mesh.get_group() if dims.dp > 1 else None,
                         width_multiple=dims.tp, stage_group=trainer.mesh["pp"].get_group() if dims.pp > 1 else None)
    with trainer.evaluation_weights() as parts:
        modes = [part.training for part in parts]
        for part in parts:
            part.eval()
        try:
            forward = pipeline_forward_of(trainer, parts) if dims.pp > 1 else forward_of(trainer, parts[0])
            results = evaluate(evaluation.tasks, forward, window=evaluation.window,
                               batch_size=evaluation.batch_size, device=trainer.device, layout=layout)
        finally:
            for part, mode in zip(parts, modes):
                part.train(mode)
    log_evaluation(trainer, results)
    return results


def log_evaluation(trainer: Trainer, results: dict[str, float]) -> None:
    metrics = trainer.metrics
    own = getattr(metrics, "log_evaluation", None)
    if own is not None:  # the core's MetricsLogger: metrics.jsonl, TensorBoard and W&B
        own(step=trainer.step, results=results)
        return
    if trainer.is_rank0:  # a spec's own metrics processor: its metrics file, and the console
        progress(f"step {trainer.step} eval | {format_results(results)}", is_rank0=True)
        with metrics.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": trainer.step, **results}) + "\n")
