"""Checkpointing with torch.distributed.checkpoint: crash-safe saves, resume, export.

The trainer's whole use::

    identity = RunIdentity(spec=..., flavor=..., converters=tuple(...),
                           param_shapes=collect_param_shapes(model_parts))
    ckpt = CheckpointManager(config=job.checkpoint, run_dir=Path(job.job.run_dir), model_parts=model_parts,
                             optimizer=optimizers, lr_schedulers=lr_schedulers, dataloader=dataloader,
                             identity=identity, is_rank0=rank == 0)
    info = ckpt.resume()                    # None: start fresh
    ...each step: ckpt.maybe_save(step, tokens_seen=tokens, last=step == steps)
    ckpt.wait()                             # before export / exit
"""

from __future__ import annotations

from .identity import ResumeInfo, RunIdentity
from .manager import CheckpointManager
from .reading import read_checkpoint_tensors
from .safetensors_export import export_safetensors
from .states import collect_param_shapes

__all__ = [
    "CheckpointManager", "ResumeInfo", "RunIdentity", "collect_param_shapes", "export_safetensors",
    "read_checkpoint_tensors",
]
