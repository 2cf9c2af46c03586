"""The compat_reader TrainSpec: the scaffold's model, with every factory of the 1.0 contract set.

Each factory reads what the core hands it through ``documented.read`` and then builds the
core's default, so the run trains as the defaults would.
"""

from __future__ import annotations

from typing import Any

import torch
from titan_compat_spec.model import CompatSpecArgs, CompatSpecModel, flops_per_token
from titan_compat_spec.tp_plan import compat_spec_tp_plan
from torch import nn

from titan_core import (
    LRSchedulersContainer,
    MetricsLogger,
    OptimizersContainer,
    TrainSpec,
    build_dataloader,
    build_tokenizer,
    cross_entropy_loss,
)
from titan_core.parallel import default_parallelize_fn

from .documented import read, read_dims

_default = default_parallelize_fn(compat_spec_tp_plan, selective_save_ops=("aten.mm.default",))


def parallelize(model: nn.Module, *, parallel_dims: Any, mesh: Any, training: Any, parallelism: Any,
                compile: Any, activation_checkpoint: Any, tp_styles: Any) -> nn.Module:
    read_dims(parallel_dims)
    for name, section in (("training", training), ("parallelism", parallelism), ("compile", compile),
                          ("activation_checkpoint", activation_checkpoint)):
        read(name, section)
    for style in (tp_styles.colwise, tp_styles.rowwise, tp_styles.prepare_module_input):
        assert isinstance(style, type)
    if parallel_dims.distributed:
        assert mesh is not None and "dp_shard" in mesh.mesh_dim_names
    return _default(model, parallel_dims=parallel_dims, mesh=mesh, training=training, parallelism=parallelism,
                    compile=compile, activation_checkpoint=activation_checkpoint, tp_styles=tp_styles)


def validate(args: Any, *, parallelism: Any, training: Any, world_size: int) -> None:
    read("parallelism", parallelism)
    read("training", training)
    assert isinstance(world_size, int) and world_size >= 1


def optimizers(model_parts: list[nn.Module], config: Any, *, device_type: str) -> torch.optim.Optimizer:
    read("optimizer", config)
    assert device_type in ("cpu", "cuda")
    return OptimizersContainer(model_parts, config, device_type=device_type)


def lr_schedulers(optimizer: torch.optim.Optimizer, config: Any, *, total_steps: int) -> Any:
    read("lr_scheduler", config)
    return LRSchedulersContainer(optimizer, config, total_steps=total_steps)


def metrics(config: Any, **options: Any) -> Any:
    read("metrics", config)
    assert isinstance(options["device"], torch.device) and isinstance(options["world_size"], int)
    return MetricsLogger(config, **options)


def tokenizer(data: Any) -> Any:
    read("data", data)
    return build_tokenizer(data.tokenizer)


def dataloader(**options: Any) -> Any:
    assert options["split"] in ("train", "validation")
    return build_dataloader(**options)


reader_spec = TrainSpec(
    name="compat_reader",
    model_cls=CompatSpecModel,
    flavors={"debugmodel": CompatSpecArgs(dim=64, n_layers=2, n_heads=4, hidden=256)},
    parallelize_fn=parallelize,
    tp_plan_fn=compat_spec_tp_plan,
    validate_fn=validate,
    flops_per_token_fn=flops_per_token,
    build_loss_fn=lambda: cross_entropy_loss,
    build_tokenizer_fn=tokenizer,
    build_dataloader_fn=dataloader,
    build_optimizers_fn=optimizers,
    build_lr_schedulers_fn=lr_schedulers,
    build_metrics_processor_fn=metrics,
    plugin_api_version="1.0",
)
