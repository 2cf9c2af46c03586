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


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tile every parameter, with tile edges (29 rows x 61 columns, 53 values) that no shard boundary of these
    layouts falls on, so shards cut through tiles."""
    import titan_core.models.init as init

    monkeypatch.setattr(init, "TILED_ABOVE", 0)
    monkeypatch.setattr(init, "TILE_ROWS", 29)
    monkeypatch.setattr(init, "TILE_COLUMNS", 61)
    monkeypatch.setattr(init, "TILE_VECTOR", 53)


def _plain_tiled(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One process's tiled init of ``model``'s parameters (the reference every shard must match)."""
    from titan_core.models.init import tiled_values

    return {fqn: tiled_values(model.init_parameter, fqn, tuple(p.shape), tuple(slice(0, n) for n in p.shape), 7)
            for fqn, p in model.named_parameters()}


@pytest.mark.parametrize(("spec", "flavor", "layout"), [
    ("llama3", "debugmodel", [("parallelism.tp", "2"), ("parallelism.dp_shard", "4")]),
    ("qwen3", "debugmoe", [("parallelism.ep", "2"), ("parallelism.tp", "2")]),
])
def test_tiled_init_draws_only_the_ranks_tiles_and_every_layout_gets_the_same_values(
        spec, flavor, layout, small_tiles) -> None:
    resolved = resolve_config(config_source=None, override_pairs=[("model.spec", spec), ("model.flavor", flavor),
                                                                  *layout], world_size=8)
    plain = build_meta_model(resolved).model
    plain.to_empty(device="cpu")
    init_model_weights(plain, seed=7)
    reference = _plain_tiled(plain)
    whole_differs = 0
    for fqn, param in plain.named_parameters():
        assert torch.equal(param, reference[fqn]), fqn  # one process fills the tiles the reference fills
        full = torch.empty(param.shape)
        plain.init_parameter(fqn, full, parameter_generator(7, fqn))
        whole_differs += not torch.equal(full, param)
    assert whole_differs > 0  # the random parameters really were tiled (norms are ones either way)

    drawn: list[str] = []
    for rank in (0, 7):
        model = build_meta_model(resolved).model
        fill = model.init_parameter
        model.init_parameter = lambda fqn, t, g, fill=fill: (drawn.append(fqn), fill(fqn, t, g))[1]
        with fake_process_group(rank=rank, world_size=8):
            mesh, _ = resolved.dims.build_meshes("cpu")
            model = parallelize_part(resolved, model, mesh=mesh, tp_styles=resolve_tp_styles([]))
            model.to_empty(device="cpu")
            drawn.clear()
            init_model_weights(model, seed=7)
            for fqn, param in model.named_parameters():
                assert isinstance(param, DTensor)
                block = local_block(param)
                assert block is not None, fqn
                assert torch.equal(param.to_local(), reference[fqn][block]), (rank, fqn)
        all_tiles = sum(-(-p.shape[-1] // (53 if p.dim() == 1 else 61)) * (-(-p.shape[-2] // 29) if p.dim() > 1 else 1)
                        * (p[..., 0, 0].numel() if p.dim() > 2 else 1) for p in plain.parameters())
        # Each rank holds an eighth or a quarter of most tensors: it draws far fewer tiles than all of them.
        assert 0 < len(drawn) < all_tiles / 2, (rank, len(drawn), all_tiles)


def test_a_model_that_does_not_declare_elementwise_init_is_filled_whole(small_tiles) -> None:
    resolved = resolve_config(config_source=None, override_pairs=[("model.spec", "llama3"),
                                                                  ("model.flavor", "debugmodel")])
    model = build_meta_model(resolved).model
    model.init_is_elementwise = False  # e.g. an init that reads the tensor's shape
    model.to_empty(device="cpu")
    init_model_weights(model, seed=7)
    for fqn, param in model.named_parameters():
        full = torch.empty(param.shape)
        model.init_parameter(fqn, full, parameter_generator(7, fqn))
        assert torch.equal(param, full), fqn
