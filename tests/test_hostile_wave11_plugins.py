"""Hostile plugins, wave 11: specs and converters another team could write from the docs. The broken ones were a
traceback deep in the loss or the backward, training that went wrong without a word (weights no gradient
reached, a causal mask of garbage, a converter's value or the model's init silently replaced), or an error
blamed on titan-core; each is now one message naming the plugin. A legal model whose blocks are not
``model.layers`` is told how to say where they are.

Each case registers its plugin in this process and runs ``titan-train``'s ``main`` (``pytest -s`` prints the
table of case, exit code and message).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import hostile_harness as harness
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from titan_core import (
    ModelConverter,
    PluginError,
    default_parallelize_fn,
    register_model_converter,
    register_train_spec,
)
from titan_core.testing.tiny_spec import TINY_SPEC, TinyTransformer, tiny_tp_plan

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = harness.table_printer(TABLE, "plugin (wave 11)")
TINY = ("--training.steps=2", "--training.seq_len=32", "--training.local_batch_size=2", "--metrics.report=false")


def titan_train(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str,
                *args: str) -> CliResult:
    harness.isolate(monkeypatch)
    result = harness.run_in_process(capsys, *TINY, f"--job.run_dir={tmp_path / 'run'}", *args)
    TABLE.append((case, result.code, harness.first_error_line(result)))
    return result


def spec_with(name: str, **change: Any) -> str:
    register_train_spec(dataclasses.replace(TINY_SPEC, name=name, **change))
    return name


# ---- what a model's forward returns --------------------------------------------------------------------------


class HalfVocabulary(TinyTransformer):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = super().forward(tokens)
        return out[..., : out.shape[-1] // 2]


class IntegerLogits(TinyTransformer):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens).long()


class DetachedLogits(TinyTransformer):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens).detach()


@pytest.mark.parametrize(("model_cls", "says"), [
    (HalfVocabulary, "it returned scores for 1024 tokens, but the vocabulary has 2048"),
    (IntegerLogits, "it returned int64 logits; logits are floating-point scores"),
    (DetachedLogits, "it returned logits outside the autograd graph (detached, or computed under torch.no_grad)"),
])
def test_logits_the_loss_cannot_use_are_the_models_error(model_cls: type[nn.Module], says: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: exit 1 and a traceback ("Target 1148 is out of bounds", "element 0 of tensors does not require
    grad") that named no plugin."""
    name = spec_with(f"w11_{model_cls.__name__.lower()}", model_cls=model_cls)
    result = titan_train(capsys, monkeypatch, tmp_path, f"{model_cls.__name__} (traceback, exit 1)", "--spec", name)
    harness.assert_one_clean_error(result, f'spec "{name}"')
    assert f"failed in the model's forward: {says}" in result.text


class NaNLogits(TinyTransformer):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens) * float("nan")


def test_a_non_finite_first_step_does_not_blame_the_learning_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "Lower optimizer.lr, check the data": no update had run, so the LR could not be the cause."""
    name = spec_with("w11_nan", model_cls=NaNLogits)
    result = titan_train(capsys, monkeypatch, tmp_path, "NaN logits at step 1 (blamed the LR)", "--spec", name)
    harness.assert_one_clean_error(result, "in this run's first step, before any update", code=3)
    assert f'so the learning rate is not the cause. The model\'s forward or init (spec "{name}")' in result.text
    assert "Lower optimizer.lr" not in result.text


# ---- buffers and blocks ----------------------------------------------------------------------------------------


class MaskInConstructor(TinyTransformer):
    """A causal mask computed in the constructor and never recomputed: garbage after to_empty."""

    def __init__(self, a: Any) -> None:
        super().__init__(a)
        self.register_buffer("causal", torch.ones(64, 64, dtype=torch.bool).tril(), persistent=False)


def test_a_model_with_buffers_and_no_init_buffers_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: trained (exit 0) with the mask holding whatever memory held: 41% True, future tokens visible."""
    name = spec_with("w11_nobufinit", model_cls=MaskInConstructor)
    result = titan_train(capsys, monkeypatch, tmp_path, "buffers, no init_buffers (garbage mask, exit 0)", "--spec",
                         name, "--dry-run")
    harness.assert_one_clean_error(result, "model class MaskInConstructor has buffers (causal) but no init_buffers() "
                                           "method")


class BlocksElsewhere(TinyTransformer):
    """The blocks as an nn.ModuleList named ``blocks``: legal, the default parallelize_fn only has to be told."""

    def __init__(self, a: Any) -> None:
        super().__init__(a)
        self.blocks = nn.ModuleList(self.layers.values())
        del self.layers

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for block in self.blocks:
            h = block(h)
        out: torch.Tensor = self.output(self.norm(h))
        return out


def test_blocks_outside_model_layers_are_named_and_blocks_attr_trains_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: --dry-run said "configuration valid", and the run failed in the default parallelize_fn with the
    error blamed on titan-core ("report it to titan-core")."""
    name = spec_with("w11_blocks", model_cls=BlocksElsewhere, tp_plan_fn=None)
    dry = titan_train(capsys, monkeypatch, tmp_path, "blocks in model.blocks, --dry-run (valid, exit 0)", "--spec",
                      name, "--dry-run")
    harness.assert_one_clean_error(dry, "looks for the model's blocks in model.layers")
    assert "(it has model.blocks). Set TrainSpec.parallelize_fn=default_parallelize_fn(tp_plan_fn, blocks_attr=...)" \
        in dry.text
    assert "titan-core's own code" not in dry.text
    told = spec_with("w11_blocks_told", model_cls=BlocksElsewhere, tp_plan_fn=None,
                     parallelize_fn=default_parallelize_fn(None, blocks_attr="blocks"))
    trained = titan_train(capsys, monkeypatch, tmp_path / "told", "blocks_attr='blocks'", "--spec", told,
                          "--activation_checkpoint.mode=full")
    assert trained.code == 0, trained.text


def test_a_tp_plan_giving_a_norm_a_linear_style_names_the_spec() -> None:
    """Before: torch's "ColwiseParallel currently only support nn.Linear", blamed on titan-core."""
    from titan_core.parallel import apply_tensor_parallel
    from titan_core.plugin.spec_factories import TensorParallelStyles

    styles = TensorParallelStyles.default()
    model = TinyTransformer(dataclasses.replace(TINY_SPEC.flavors["debugmodel"], vocab_size=32))
    plan = {**tiny_tp_plan(model, styles=styles, loss_parallel=False), "norm": styles.colwise()}
    with pytest.raises(PluginError, match=r'spec "x": the tensor-parallel plan gives a column- or row-wise style to '
                                          r"modules that are neither linear nor embedding layers: \['norm \(RMSNorm"):
        apply_tensor_parallel(model, None, plan, owner='spec "x"')


# ---- converters --------------------------------------------------------------------------------------------------


def _replace(model: nn.Module, fqn: str, new: nn.Module) -> None:
    parent, _, leaf = fqn.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


class _EveryBlockLinear(ModelConverter):
    """Replaces every block's nn.Linear by what ``replacement`` (each subclass's own) makes of it."""

    plugin_api_version = "1.0"
    replacement: Any  # (linear) -> the module put in its place

    def select(self, model: nn.Module) -> list[str]:
        return [n for n, m in model.named_modules() if n.startswith("layers.") and type(m) is nn.Linear]

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            _replace(model, fqn, self.replacement(model.get_submodule(fqn)))


class QuantizedNoGradient(nn.Linear):
    """Rounds its weight through .detach(): no gradient ever reaches it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.detach()
        return F.linear(x, (w * 127).round() / 127)


class DetachesWeights(_EveryBlockLinear):
    def replacement(self, linear: nn.Linear) -> nn.Module:
        with torch.device("meta"):
            new = QuantizedNoGradient(linear.in_features, linear.out_features, bias=False)
        new.weight = linear.weight
        return new


class ScaleMadeOnCpu(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        self.scale = nn.Parameter(torch.ones(linear.out_features))  # real memory on a meta model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) * self.scale


class AddsCpuParameter(_EveryBlockLinear):
    def replacement(self, linear: nn.Linear) -> nn.Module:
        return ScaleMadeOnCpu(linear)


class Wrapper(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.inner = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        return out


class WrapsModules(_EveryBlockLinear):
    def replacement(self, linear: nn.Linear) -> nn.Module:
        return Wrapper(linear)


@pytest.mark.parametrize(("cls", "says"), [
    (DetachesWeights, "parameter(s) of the modules it converted got no gradient in the first step (e.g. "
                      "layers.0.attention.wq.weight)"),
    (AddsCpuParameter, "left 14 parameter(s) off the meta device after convert() (e.g. layers.0.attention.wq.scale "
                       "on cpu)"),
    (WrapsModules, "14 parameter(s) of the model are no longer at their names after convert() (e.g. "
                   "layers.0.attention.wq.weight (now layers.0.attention.wq.inner.weight?))"),
])
def test_a_converter_that_would_train_wrongly_is_named(cls: type[ModelConverter[Any]], says: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: exit 0 each. The layers it converted never learned; the converter's value 1.0 was replaced by the
    model's init; the wrapped weights drew another init (their names changed)."""
    name = f"w11_{cls.__name__.lower()}"
    register_model_converter(name, cls)
    result = titan_train(capsys, monkeypatch, tmp_path, f"converter {cls.__name__} (trained wrongly, exit 0)",
                         "--spec", "tiny", "--converters", name)
    harness.assert_one_clean_error(result, f'converter "{name}"')
    assert says in result.text, result.text


class KeepsParameters(_EveryBlockLinear):
    """The legal way: an nn.Linear subclass holding the same parameters."""

    def replacement(self, linear: nn.Linear) -> nn.Module:
        with torch.device("meta"):
            new = type("ClampedLinear", (nn.Linear,), {"forward": lambda s, x: F.linear(x, s.weight).clamp(-1e4, 1e4)})(
                linear.in_features, linear.out_features, bias=False)
        new.weight = linear.weight
        return new


def test_a_converter_keeping_its_parameters_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    register_model_converter("w11_keeps", KeepsParameters)
    result = titan_train(capsys, monkeypatch, tmp_path, "converter keeping its parameters", "--spec", "tiny",
                         "--converters", "w11_keeps")
    assert result.code == 0, result.text
