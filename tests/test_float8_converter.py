"""titan-float8: settings resolution, selection, errors, and equivalence with torchao's own API."""

from __future__ import annotations

import sys

import pytest
import torch
import torchao.float8 as ao_float8
from pydantic import ValidationError
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from titan_core.config.parallel_dims import ParallelDims
from titan_core.errors import ConfigError, TitanError
from titan_core.train.converters import apply_converters, register_converter_hooks
from titan_float8 import Float8Config, Float8Converter, fqn_matches, hardware
from titan_float8.settings import GLOO_REASON

import converter_helpers as helpers
from converter_helpers import LLAMA, assert_same_as_reference, job, materialize

torch.set_num_threads(1)
RECIPES = ["tensorwise", "rowwise", "rowwise_with_gw_hp"]


def dims(dp_shard: int = 1, tp: int = 1) -> ParallelDims:
    return ParallelDims(dp_replicate=1, dp_shard=dp_shard, tp=tp, pp=1, world_size=dp_shard * tp)


def make(device: str = "cpu", backend: str = "gloo", dp_shard: int = 1, tp: int = 1, **config) -> Float8Converter:
    return Float8Converter(Float8Config(**config), parallel_dims=dims(dp_shard, tp), job=job(device, backend))


class Toy(nn.Module):
    """Linears of float8-friendly dims, one that is not (24), a biased one, and an output head."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({
            "1": nn.ModuleDict({"w1": nn.Linear(32, 64, bias=False), "w2": nn.Linear(64, 32)}),
            "10": nn.ModuleDict({"w1": nn.Linear(32, 64, bias=False), "w2": nn.Linear(64, 32)}),
        })
        self.odd = nn.Linear(32, 24, bias=False)
        self.output = nn.Linear(32, 48, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers.values():
            x = x + block["w2"](torch.relu(block["w1"](x)))
        return self.output(x) + self.odd(x).sum(-1, keepdim=True)


# --- settings resolution (no GPU needed) -------------------------------------------------


def test_cpu_defaults_emulate_and_no_all_gather() -> None:
    conv = make()
    s = conv.settings
    assert (s.emulate, s.enable_fsdp_float8_all_gather, s.precompute_scale) == (True, False, False)
    assert "FSDP is not enabled" in s.reason
    assert conv.torchao_config().emulate is True
    assert register_converter_hooks(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1), [conv], []).registered == []


def test_nccl_with_fsdp_turns_all_gather_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (9, 0))
    conv = make(device="cuda", backend="nccl", dp_shard=2)
    s = conv.settings
    assert (s.emulate, s.enable_fsdp_float8_all_gather, s.precompute_scale) == (False, True, True)
    assert "nccl" in s.reason and "dp_shard=2" in s.reason
    cfg = conv.torchao_config()
    assert cfg.enable_fsdp_float8_all_gather is True and cfg.emulate is False
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1)
    assert register_converter_hooks(opt, [conv], []).registered == ["Float8Converter.post_optimizer_hook"]


def test_emulated_nccl_fsdp_also_resolves_on() -> None:
    s = make(device="cpu", backend="nccl", dp_shard=2, emulate=True).settings
    assert (s.emulate, s.enable_fsdp_float8_all_gather) == (True, True)


def test_gloo_keeps_all_gather_off_with_reason() -> None:
    conv = make(backend="gloo", dp_shard=2)
    assert conv.settings.enable_fsdp_float8_all_gather is False
    assert conv.settings.reason == GLOO_REASON
    assert "Invalid scalar type" in GLOO_REASON


@pytest.mark.parametrize("recipe", ["rowwise", "rowwise_with_gw_hp"])
def test_rowwise_keeps_all_gather_off(recipe: str) -> None:
    s = make(backend="nccl", dp_shard=2, recipe=recipe).settings
    assert s.enable_fsdp_float8_all_gather is False
    assert "tensorwise" in s.reason
    # torchao accepts our resolved combination
    assert make(backend="nccl", dp_shard=2, recipe=recipe).torchao_config().enable_fsdp_float8_all_gather is False


def test_explicit_all_gather_on_impossible_combinations_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"fsdp_float8_all_gather=true.*tensorwise.*--float8.recipe=tensorwise"):
        make(backend="nccl", dp_shard=2, recipe="rowwise", fsdp_float8_all_gather=True)
    with pytest.raises(ConfigError, match=r"gloo cannot all-gather float8 dtypes"):
        make(backend="gloo", dp_shard=2, fsdp_float8_all_gather="true")
    assert make(backend="nccl", dp_shard=2, fsdp_float8_all_gather=False).settings.reason.endswith("=false")


def test_old_cuda_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (8, 0))
    for emulate in ("auto", False):
        with pytest.raises(TitanError) as info:
            make(device="cuda", backend="nccl", emulate=emulate)
        text = str(info.value)
        assert "8.9" in text and "SM89" in text and "8.0" in text and "sm_80" in text
        assert "--float8.emulate=true" in text
    assert make(device="cuda", backend="nccl", emulate=True).settings.emulate is True


def test_real_kernels_on_sm89(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (8, 9))
    assert make(device="cuda", backend="nccl").settings.emulate is False


def test_emulate_false_on_cpu_is_an_error() -> None:
    with pytest.raises(TitanError, match=r"float8.emulate=false.*device cpu.*--float8.emulate=auto"):
        make(emulate=False)


def test_missing_torchao_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    helpers.assert_missing_torchao_refused(monkeypatch, "torchao.float8", make,
                                           r"the float8 converter needs torchao: pip install 'torchao>=0.18'")


# --- config validation -------------------------------------------------------------------


def test_bad_config_values() -> None:
    helpers.assert_config_refuses(Float8Config, bad_recipe="blockwise", misspelled="filter_fqn")
    with pytest.raises(ValidationError, match="emulate"):
        Float8Config(emulate="maybe")
    assert Float8Config(emulate="true").emulate is True
    assert Float8Config(emulate="False").emulate is False
    assert Float8Config(emulate="auto").emulate == "auto"


# --- selection ---------------------------------------------------------------------------


def test_fqn_matching_rule() -> None:
    assert fqn_matches("output", "output")
    assert fqn_matches("layers.3.feed_forward.w1", "feed_forward.w1")
    assert fqn_matches("layers.1.attention.wq", "layers.1")
    assert fqn_matches("layers.1.attention.wq", "attention")
    assert not fqn_matches("layers.10.attention.wq", "layers.1")
    assert not fqn_matches("layers.0.feed_forward.w12", "w1")


def test_default_selection_skips_output_and_odd_dims() -> None:
    assert make().select(Toy()) == ["layers.1.w1", "layers.1.w2", "layers.10.w1", "layers.10.w2"]


def test_fqns_and_filter_fqns() -> None:
    conv = make(fqns=["layers.1"], filter_fqns=["w2"])
    assert conv.select(Toy()) == ["layers.1.w1"]
    assert make(fqns=["output"], filter_fqns=[]).select(Toy()) == ["output"]


def test_fqns_matching_nothing_names_them_and_real_modules() -> None:
    with pytest.raises(ConfigError) as info:
        make(fqns=["feed_forward.w1", "layers.1"]).select(Toy())
    text = str(info.value)
    assert "float8.fqns entries ['feed_forward.w1']" in text
    assert "layers.1.w1" in text and "output" in text


def test_auto_filter_small_kn_uses_torchao_heuristic() -> None:
    with torch.device("meta"):
        model = nn.ModuleDict({"small": nn.Linear(64, 64, bias=False), "big": nn.Linear(8192, 2048, bias=False)})
    assert make(auto_filter_small_kn=True).select(model) == ["big"]
    assert make().select(model) == ["small", "big"]
    with pytest.raises(ConfigError, match="auto_filter_small_kn is not available with float8.recipe=rowwise_with_gw_hp"):
        make(auto_filter_small_kn=True, recipe="rowwise_with_gw_hp")


def test_tensor_parallel_styles() -> None:
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    styles = make(tp=2, backend="nccl").tensor_parallel_styles()
    assert styles is not None
    assert issubclass(styles.colwise, Float8ColwiseParallel)
    assert issubclass(styles.rowwise, Float8RowwiseParallel)
    assert issubclass(styles.prepare_module_input, PrepareFloat8ModuleInput)
    assert make(tp=2, backend="nccl", recipe="rowwise").tensor_parallel_styles() is None
    assert make(tp=1, backend="nccl").tensor_parallel_styles() is None
    # gloo cannot move float8 activations: torch's styles shard the Float8Linear weights instead
    assert make(tp=2, backend="gloo").tensor_parallel_styles() is None


TP_SCRIPT = """
import dataclasses, os, sys, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module
from torchao.float8 import Float8LinearConfig, convert_to_float8_training
from torchao.float8 import float8_tensor_parallel as ao_tp
from titan_float8.tp import float8_tp_styles
from titan_core import TensorParallelStyles

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))

class FF(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(32, 64, bias=False), nn.Linear(64, 32, bias=False), nn.Linear(32, 64, bias=False)
    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = FF(), FF()
    def forward(self, x):
        return self.b(self.a(x))

def build():
    torch.manual_seed(0)
    m = M()
    cfg = dataclasses.replace(Float8LinearConfig(), emulate=True)
    # block a all float8, block b mixed (what float8,mx or a filter leaves)
    convert_to_float8_training(m, config=cfg, module_filter_fn=lambda mod, fqn: fqn.startswith("a.") or fqn == "b.w1")
    return m

def plan(st):
    out = {}
    for p in ("a", "b"):
        out[p] = st.prepare_module_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        out[p + ".w1"], out[p + ".w3"] = st.colwise(), st.colwise()
        out[p + ".w2"] = st.rowwise(output_layouts=Shard(1))
    return out

x = torch.randn(2, 8, 32)
ref = build()(x)
m = build()
parallelize_module(m, mesh, plan(float8_tp_styles()))
print("ours", (m(x) - ref).abs().max().item())
raw = TensorParallelStyles(ao_tp.Float8ColwiseParallel, ao_tp.Float8RowwiseParallel, ao_tp.PrepareFloat8ModuleInput)
try:
    parallelize_module(build(), mesh, plan(raw))
    print("raw ok")
except ValueError as exc:
    print("raw ValueError", "Float8Linear" in str(exc))
dist.destroy_process_group()
"""


def test_float8_tp_styles_fall_back_on_non_float8_modules(tmp_path) -> None:
    """One rank, gloo: float8 styles on float8 modules, torch's on the rest, same output as no TP."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", TP_SCRIPT, str(tmp_path / "pg")], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("ours", "raw"))]
    assert lines == ["ours 0.0", "raw ValueError True"], proc.stdout


# --- conversion: equal to torchao's own API ----------------------------------------------


def reference_conversion(model: nn.Module, recipe: str, fqns: list[str]) -> None:
    import dataclasses

    cfg = dataclasses.replace(ao_float8.Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    wanted = set(fqns)
    ao_float8.convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn in wanted)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("kind", ["toy", "llama"])
def test_equivalent_to_torchao(recipe: str, kind: str) -> None:
    def build() -> nn.Module:
        return helpers.on_meta(kind, Toy)

    ours, theirs, plain = build(), build(), materialize(build())
    conv = make(recipe=recipe)
    table = apply_converters(ours, [("float8", conv)], spec=None)
    fqns = table.modules_of("float8")
    reference_conversion(theirs, recipe, fqns)
    assert fqns == conv.select(build())
    types = lambda m: {fqn: type(mod) for fqn, mod in m.named_modules()}  # noqa: E731
    assert types(ours) == types(theirs)
    assert all(isinstance(ours.get_submodule(f), Float8Linear) for f in fqns)
    assert {row.after for row in table.rows} == {"Float8Linear"}
    materialize(ours), materialize(theirs)

    x = torch.randint(0, LLAMA.vocab_size, (2, 16)) if kind == "llama" else torch.randn(2, 8, 32)
    assert_same_as_reference(ours, theirs, plain, x)


def test_training_tracks_float32() -> None:
    _, f8, ref = helpers.trained_with_and_without([("float8", make())], steps=6)
    assert f8[-1] < f8[0] - 0.5
    assert max(abs(a - b) for a, b in zip(f8, ref)) < 0.02, (f8, ref)


def test_post_hook_precomputes_scales_on_every_part(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[nn.Module] = []
    real = ao_float8.precompute_float8_dynamic_scale_for_fsdp
    monkeypatch.setattr(ao_float8, "precompute_float8_dynamic_scale_for_fsdp", lambda m: (calls.append(m), real(m)))
    conv = make(backend="nccl", dp_shard=2, emulate=True)
    parts = [nn.Linear(16, 16), nn.Linear(16, 16)]
    opt = torch.optim.SGD([p for part in parts for p in part.parameters()], lr=0.1)
    register_converter_hooks(opt, [conv], parts)
    opt.step()
    opt.step()
    assert calls == parts + parts
