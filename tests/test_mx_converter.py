"""titan-mx-prototype: hardware errors, selection, float8+mx together, equivalence with torchao, training."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn
from torchao import quantize_
from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor
from torchao.quantization.quantize_.common import KernelPreference

from titan_core.config.parallel_dims import ParallelDims
from titan_core.errors import ConfigError, TitanError
from titan_core.runtime.torch_compat import dtensor_has_single_dim_scaled_mm
from titan_core.train.converters import apply_converters, register_converter_hooks
from titan_float8 import Float8Config, Float8Converter
from titan_mx_prototype import MXConfig, MXConverter, hardware

import converter_helpers as helpers
from conftest import REPO
from converter_helpers import (
    LLAMA,
    assert_same_as_reference,
    job,
    llama_on_meta,
    materialize,
    moe_losses_with_and_without,
    qwen3_moe_on_meta,
)

torch.set_num_threads(1)
FFN = [f"layers.{i}.feed_forward.w{j}" for i in range(2) for j in (1, 2, 3)]
ATTENTION = [f"layers.{i}.attention.w{j}" for i in range(2) for j in "qkvo"]


DIMS = ParallelDims(1, 1, 1, 1, 1)
# torchao 0.18's MXFP8 training needs torch 2.13's DTensor (torch 2.11, the GPU image's, lacks it): there the
# converter refuses, which test_a_torch_without_mxfp8_training_is_refused checks on every torch.
needs_mx_torch = pytest.mark.skipif(not dtensor_has_single_dim_scaled_mm(),
                                    reason=f"MXFP8 training needs torch >= 2.13 (this is {torch.__version__})")


def make(device: str = "cpu", **config) -> MXConverter:
    return MXConverter(MXConfig(**config), parallel_dims=DIMS, job=job(device, "nccl" if device == "cuda" else "gloo"))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128, bias=False)
        self.down = nn.Linear(128, 64, bias=False)
        self.biased = nn.Linear(64, 64)  # MX drops biases in torchao 0.18: never selected
        self.narrow = nn.Linear(64, 48, bias=False)  # 48 is not a multiple of the block size 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.down(torch.relu(self.up(x)))
        return self.biased(h) + self.narrow(h).mean(-1, keepdim=True)


def test_marked_as_a_prototype_in_list_output_and_readme(cli) -> None:
    result = cli("--list")
    assert result.code == 0, result.text
    lines = {line.split()[0]: line.rstrip() for line in result.out.splitlines() if line.startswith("  ")}
    assert lines["mx"].endswith("[prototype]") and "[prototype]" not in lines["float8"]
    readme = (REPO / "plugins" / "titan-mx-prototype" / "README.md").read_text()
    assert readme.startswith("# titan-mx-prototype\n\n> **Prototype.**")


def test_is_a_prototype_without_optimizer_hooks() -> None:
    conv = make()
    assert MXConverter.prototype is True
    assert conv.emulate is True
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1)
    assert register_converter_hooks(opt, [conv], []).registered == []


def test_unsupported_gpu_explains_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (9, 0))
    for emulate in ("auto", False):
        with pytest.raises(TitanError) as info:
            make(device="cuda", emulate=emulate)
        text = str(info.value)
        assert "Blackwell" in text and "SM100" in text and "9.0" in text and "sm_90" in text
        assert "--mx.emulate=true" in text
    assert make(device="cuda", emulate=True).torchao_config().kernel_preference == KernelPreference.EMULATED


def test_blackwell_uses_real_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (10, 0))
    conv = make(device="cuda")
    assert conv.emulate is False
    assert conv.torchao_config().kernel_preference == KernelPreference.AUTO


def test_emulate_false_on_cpu_is_an_error() -> None:
    with pytest.raises(TitanError, match=r"mx.emulate=false.*Blackwell.*device cpu"):
        make(emulate="false")


def test_missing_torchao_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    helpers.assert_missing_torchao_refused(monkeypatch, "torchao.prototype.moe_training.config", make,
                                           r"the mx converter needs torchao.*pip install 'torchao>=0.18'")


def test_a_torch_without_mxfp8_training_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import titan_mx_prototype.converter as mx_module

    monkeypatch.setattr(mx_module, "dtensor_has_single_dim_scaled_mm", lambda: False)  # what torch 2.11 answers
    model = Toy()
    with pytest.raises(TitanError, match=r"the mx converter needs torch >= 2.13, this is torch .*leave \[mx\] out"):
        make().convert(model, ["up"])
    assert type(model.up.weight.data) is torch.Tensor  # nothing converted


def test_bad_config_values() -> None:
    helpers.assert_config_refuses(MXConfig, bad_recipe="mxfp4", misspelled="fqn")
    assert MXConfig().fqns == ["feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]
    assert MXConfig().filter_fqns == ["output"]


def test_default_selection_is_the_feed_forward() -> None:
    assert make().select(llama_on_meta()) == FFN


def test_selection_skips_biased_and_misaligned_linears() -> None:
    assert make(fqns=[]).select(Toy()) == ["up", "down"]
    with pytest.raises(ConfigError, match=r"mx.fqns entries \['feed_forward.w1', 'feed_forward.w2', 'feed_forward.w3'\]"):
        make().select(Toy())


@needs_mx_torch
def test_float8_then_mx_with_defaults_gives_both_modules() -> None:
    model = llama_on_meta()
    float8 = Float8Converter(Float8Config(), parallel_dims=DIMS, job=job())
    table = apply_converters(model, [("float8", float8), ("mx", make())], spec=None)
    assert table.modules_of("float8") == ATTENTION
    assert table.modules_of("mx") == FFN
    assert type(model.output) is nn.Linear


def test_mx_then_float8_leaves_mx_empty_with_a_pointer() -> None:
    float8 = Float8Converter(Float8Config(), parallel_dims=DIMS, job=job())
    with pytest.raises(ConfigError) as info:
        apply_converters(llama_on_meta(), [("mx", make()), ("float8", float8)], spec=None)
    text = str(info.value)
    assert 'converter "mx"' in text and 'taken by "float8"' in text
    assert "mx.fqns" in text and "float8.filter_fqns" in text


def torchao_reference(model: nn.Module, recipe: str, fqns: list[str]) -> None:
    cfg = dataclasses.replace(MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe(recipe)),
                              kernel_preference=KernelPreference.EMULATED)
    wanted = set(fqns)
    quantize_(model, cfg, filter_fn=lambda m, fqn: fqn in wanted)


def kinds(model: nn.Module) -> dict[str, tuple[type, type]]:
    return {fqn: (type(m), type(m.weight.data)) for fqn, m in model.named_modules() if isinstance(m, nn.Linear)}


@needs_mx_torch
@pytest.mark.parametrize("recipe", ["mxfp8_rceil", "mxfp8_rceil_wgrad_with_hp"])
@pytest.mark.parametrize("kind", ["toy", "llama"])
def test_equivalent_to_torchao(recipe: str, kind: str) -> None:
    def build() -> nn.Module:
        return helpers.on_meta(kind, Toy)

    conv = make(recipe=recipe, **({} if kind == "llama" else {"fqns": []}))
    ours, theirs, plain = build(), build(), materialize(build())
    table = apply_converters(ours, [("mx", conv)], spec=None)
    fqns = table.modules_of("mx")
    assert fqns == (FFN if kind == "llama" else ["up", "down"])
    torchao_reference(theirs, recipe, fqns)
    assert kinds(ours) == kinds(theirs)
    assert {row.after for row in table.rows} == {"Linear(weight=MXFP8TrainingWeightWrapperTensor)"}
    materialize(ours), materialize(theirs)
    # initialising in place keeps the MX wrapper
    assert all(isinstance(ours.get_submodule(f).weight.data, MXFP8TrainingWeightWrapperTensor) for f in fqns)

    x = torch.randint(0, LLAMA.vocab_size, (2, 32)) if kind == "llama" else torch.randn(2, 32, 64)
    assert_same_as_reference(ours, theirs, plain, x)


@needs_mx_torch
def test_llama_trains_with_float8_and_mx() -> None:
    float8 = Float8Converter(Float8Config(), parallel_dims=DIMS, job=job())
    converted, low, ref = helpers.trained_with_and_without([("float8", float8), ("mx", make())], steps=8)
    assert all(math.isfinite(v) for v in low)
    assert low[-1] < low[0] - 1.0
    assert max(abs(a - b) for a, b in zip(low, ref)) < 0.05, (low, ref)
    # still MX after the optimizer updated the weights in place
    assert isinstance(converted.layers["0"].feed_forward.w1.weight.data, MXFP8TrainingWeightWrapperTensor)


@needs_mx_torch
def test_moe_experts_run_mxfp8_grouped_gemms_and_train_close_to_fp32() -> None:
    """--mx.moe_fqns=experts: the stacked experts' grouped GEMMs go through torchao's MXFP8 path
    (emulated on CPU); the table names them; a few AdamW steps stay finite and near fp32."""
    assert make().select(qwen3_moe_on_meta()) == FFN[:3]  # opt-in: the experts only when asked
    converted = qwen3_moe_on_meta()
    table = apply_converters(converted, [("mx", make(moe_fqns=["experts"]))], spec=None)
    rows = {row.module: row.after for row in table.rows}
    assert rows == {**{f: "Linear(weight=MXFP8TrainingWeightWrapperTensor)" for f in FFN[:3]},
                    "layers.1.moe.experts": "GroupedExperts(w1,w2,w3=MXFP8TrainingWeightWrapperTensor)"}
    low, ref = moe_losses_with_and_without(converted, steps=3)
    assert all(math.isfinite(v) for v in low) and low[-1] < low[0] - 0.5
    # Within 0.05 of the fp32 losses (as float8+mx on llama above); measured 0.02 over 5 steps
    # of 4 x 32 tokens, the experts' MXFP8 rounding (e4m3 elements, one scale per 32) included.
    assert max(abs(a - b) for a, b in zip(low, ref)) < 0.05, (low, ref)
    assert isinstance(converted.get_submodule("layers.1.moe.experts").w2.data, MXFP8TrainingWeightWrapperTensor)


def test_moe_fqns_that_match_no_experts_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"mx.moe_fqns entries \['expert'\] match no GroupedExperts"):
        make(moe_fqns=["expert"]).select(qwen3_moe_on_meta())
