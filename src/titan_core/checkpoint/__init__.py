"""Checkpointing with torch.distributed.checkpoint: crash-safe saves, resume, export.

The trainer's whole use::

    identity = RunIdentity(spec=..., flavor=..., converters=tuple(...),
                           param_shapes=collect_param_shapes(model_parts))
    states = training_states(model_parts, optimizers, lr_schedulers=lr_schedulers, dataloader=dataloader,
                             progress=trainer)  # named Statefuls: the checkpoint's top-level keys
    ckpt = CheckpointManager(config=job.checkpoint, run_dir=Path(job.job.run_dir), states=states,
                             identity=identity, is_rank0=rank == 0)
    info = ckpt.resume()                    # None: start fresh
    ...each step: ckpt.maybe_save(step, tokens_seen=tokens, last=step == steps)
    ckpt.wait()                             # before export / exit

``write_weights_checkpoint`` publishes a checkpoint of the weights alone, with extra files.

May import ``optim``, ``moe``, ``plugin``, ``models``, ``config``, ``runtime`` and the leaves;
independent of ``data``, ``observability`` and ``parallel``.
"""

from __future__ import annotations

from .identity import ResumeInfo, RunIdentity
from .manager import CheckpointManager
from .reading import read_checkpoint_tensors
from .safetensors_export import export_safetensors
from .stateful import ModelState, OptimizerState, Stateful, StepCounter, training_states
from .states import collect_param_shapes
from .weights_only import write_weights_checkpoint

__all__ = [
    "CheckpointManager", "ResumeInfo", "RunIdentity", "collect_param_shapes", "export_safetensors",
    "ModelState", "OptimizerState", "Stateful", "StepCounter", "read_checkpoint_tensors", "training_states",
    "write_weights_checkpoint",
]
