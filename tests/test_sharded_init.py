"""Each rank's shard is cut from the full initial tensor on the CPU and only it is copied (models/init.py):
the values are bit for bit those ``distribute_tensor`` cut before, on every rank of a layout, checked
under the fake process group (one process plays ranks of an 8-rank job)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from titan_core.models.init import init_model_weights, local_block, parameter_generator
from titan_core.parallel.fake_group import fake_process_group
from titan_core.plan.resolve import resolve_config
from titan_core.train.build import build_meta_model, parallelize_part
from titan_core.train.tp_styles import resolve_tp_styles


@pytest.mark.parametrize(("spec", "flavor", "layout"), [
    ("llama3", "debugmodel", [("parallelism.tp", "2"), ("parallelism.dp_shard", "4")]),
    ("qwen3", "debugmoe", [("parallelism.ep", "2"), ("parallelism.tp", "2")]),
])
def test_every_shard_is_cut_on_the_cpu_with_the_values_distribute_tensor_gave(spec, flavor, layout) -> None:
    resolved = resolve_config(config_source=None, override_pairs=[("model.spec", spec), ("model.flavor", flavor),
                                                                  *layout], world_size=8)
    for rank in (0, 7):
        model = build_meta_model(resolved).model
        with fake_process_group(rank=rank, world_size=8):
            mesh, _ = resolved.dims.build_meshes("cpu")
            model = parallelize_part(resolved, model, mesh=mesh, tp_styles=resolve_tp_styles([]))
            model.to_empty(device="cpu")
            init_model_weights(model, seed=7)
            sharded = 0
            for fqn, param in model.named_parameters():
                full = torch.empty(param.shape)
                model.init_parameter(fqn, full, parameter_generator(7, fqn))
                if isinstance(param, DTensor):
                    assert local_block(param) is not None, fqn  # every shard of these layouts is one block
                    sharded += 1
                    expected = distribute_tensor(full, param.device_mesh, param.placements,
                                                 src_data_rank=None).to_local()
                    assert torch.equal(param.to_local(), expected), (rank, fqn)
                else:
                    assert torch.equal(param, full), (rank, fqn)
            assert sharded == len(list(model.parameters()))
