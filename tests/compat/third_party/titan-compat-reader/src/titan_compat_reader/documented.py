"""The plugin API 1.0 contract as documented: each section's fields, and the values an enumerated
field could take (``None``: any value of the documented type)."""

from __future__ import annotations

from typing import Any

import torch

# The docs' own tables, the way a plugin maps config strings to torch objects.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
COMPUTE = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}

SECTIONS: dict[str, dict[str, set[Any] | None]] = {
    "training": {"steps": None, "local_batch_size": None, "global_batch_size": None, "seq_len": None,
                 "max_norm": None, "seed": None, "deterministic": None, "dtype": set(COMPUTE),
                 "device": {"auto", "cpu", "cuda"}, "cpu_malloc_tuning": None, "skip_nonfinite_steps": None},
    "parallelism": {"dp_replicate": None, "dp_shard": None, "tp": None, "pp": None, "pp_schedule": None,
                    "pp_microbatches": None, "pp_stages_per_rank": None, "pp_split_points": None,
                    "loss_parallel": None, "fsdp_reshard_after_forward": {"default", "always", "never"},
                    "param_dtype": set(DTYPES), "reduce_dtype": set(DTYPES), "backend": {"auto", "gloo", "nccl"},
                    "init_timeout_s": None, "collective_timeout_s": None},
    "compile": {"enable": None},
    "activation_checkpoint": {"mode": {"none", "full", "selective"}, "selective_every": None,
                              "selective_save_ops": None},
    "optimizer": {"name": {"AdamW", "Adam", "SGD"}, "lr": None, "betas": None, "eps": None, "weight_decay": None,
                  "implementation": {"auto", "foreach", "for-loop", "fused"}},
    "lr_scheduler": {"warmup_steps": None, "decay_type": {"linear", "cosine", "wsd", "constant"},
                     "decay_ratio": None, "min_lr_factor": None},
    "data": {"source": None, "text_field": None, "hf_split": None, "allow_download": None, "tokenizer": None,
             "val_fraction": None},
    "metrics": {"log_freq": None, "wandb": None, "wandb_project": None, "peak_tflops": None},
}
PARALLEL_DIMS = ("dp_replicate", "dp_shard", "tp", "pp", "world_size", "dp", "fsdp_enabled",
                 "dp_replicate_enabled", "tp_enabled", "pp_enabled", "distributed")


def read(name: str, section: Any) -> None:
    """Read every documented field of ``section``; an enumerated one must hold a documented value."""
    for field, values in SECTIONS[name].items():
        value = getattr(section, field)
        if values is not None and value not in values:
            raise KeyError(f"{name}.{field} = {value!r}: not a value plugin API 1.0 documented ({sorted(values)})")
    # The 1.0 docs' own pattern: the FSDP2 dtypes through a plugin's table.
    if name == "parallelism":
        DTYPES[section.param_dtype], DTYPES[section.reduce_dtype]  # noqa: B018


def read_dims(dims: Any) -> None:
    for field in PARALLEL_DIMS:
        getattr(dims, field)
    assert dims.dp_replicate * dims.dp_shard * dims.tp * dims.pp == dims.world_size
