"""What the float8 and MX converter tests share: a tiny Llama, materialising on CPU, the
"same as torchao's own API" check, a short training loop, and the checks of a missing torchao
and of the config model."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ValidationError
from torch import nn

from titan_core.config.sections import CompileSection, ParallelismSection, TrainingSection
from titan_core.errors import TitanError
from titan_core.plugin.protocols import RunContext
from titan_core.train.converters import apply_converters
from titan_llama.model import LlamaArgs, Transformer

LLAMA = LlamaArgs(dim=64, n_layers=2, n_heads=4, vocab_size=256, multiple_of=32, max_seq_len=64)


def job(device: str = "cpu", backend: str = "gloo") -> RunContext:
    return RunContext(torch.device(device), backend, TrainingSection(), ParallelismSection(), CompileSection())


def llama_on_meta() -> Transformer:
    with torch.device("meta"):
        return Transformer(LLAMA)


def qwen3_moe_on_meta() -> nn.Module:
    """debugmoe cut to 2 layers, layer 0 dense (so the default feed-forward selection has linears)."""
    from titan_qwen3.flavors import qwen3_flavors
    from titan_qwen3.model import Transformer as Qwen3

    args = dataclasses.replace(qwen3_flavors["debugmoe"], n_layers=2, vocab_size=256, mlp_only_layers=(0,),
                               max_seq_len=64)
    with torch.device("meta"):
        return Qwen3(args)


def moe_losses_with_and_without(converted: nn.Module, steps: int) -> tuple[list[float], list[float]]:
    """``converted`` (a converted ``qwen3_moe_on_meta()``) and the plain model, given the same init and trained
    ``steps`` steps on one seeded batch: (the converted model's losses, the float32 losses)."""
    models = [converted, qwen3_moe_on_meta()]
    for model in models:
        materialize(model)
        model.init_weights(0)  # type: ignore[operator]
    torch.manual_seed(0)
    data = torch.randint(0, 256, (2, 33))
    low, ref = (train_losses(model, data, steps=steps) for model in models)
    return low, ref


def on_meta(kind: str, toy: type[nn.Module]) -> nn.Module:
    """The tiny Llama (``kind`` "llama") or the test's ``toy`` model, on the meta device."""
    if kind == "llama":
        return llama_on_meta()
    with torch.device("meta"):
        return toy()


def materialize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Real CPU tensors with seeded values (the Llama's own init, small normals for toys)."""
    model.to_empty(device="cpu")
    if isinstance(model, Transformer):
        model.init_weights(seed)
    else:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def assert_same_as_reference(ours: nn.Module, theirs: nn.Module, plain: nn.Module, x: torch.Tensor) -> None:
    """Our conversion and torchao's give the same output and gradients, bit for bit; both differ
    from the unconverted model by low-precision rounding only (under 10% relative)."""
    y_ours, y_theirs = ours(x), theirs(x)
    assert torch.equal(y_ours, y_theirs)
    y_ours.square().mean().backward()
    y_theirs.square().mean().backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(a.grad, b.grad), name
    y_plain = plain(x)
    rel = ((y_ours - y_plain).norm() / y_plain.norm()).item()
    assert 0 < rel < 0.1, rel


def train_losses(model: nn.Module, data: torch.Tensor, steps: int) -> list[float]:
    """``steps`` AdamW steps of next-token prediction on one fixed batch of token windows."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out = []
    for _ in range(steps):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def trained_with_and_without(converters: list[tuple[str, Any]], steps: int) -> tuple[nn.Module, list[float], list[float]]:
    """The tiny Llama converted by ``converters`` and the plain one, each trained ``steps`` steps on one seeded
    batch: (the converted model, its losses, the float32 losses)."""
    torch.manual_seed(0)
    data = torch.randint(0, LLAMA.vocab_size, (4, 33))
    converted = llama_on_meta()
    apply_converters(converted, converters, spec=None)
    low = train_losses(materialize(converted), data, steps=steps)
    return converted, low, train_losses(materialize(llama_on_meta()), data, steps=steps)


def assert_missing_torchao_refused(monkeypatch: pytest.MonkeyPatch, module: str, make: Callable[[], Any],
                                   message: str) -> None:
    """With torchao's ``module`` unimportable, building the converter fails with ``message`` (a regex)."""
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(TitanError, match=message):
        make()


def assert_config_refuses(config: type[BaseModel], *, bad_recipe: str, misspelled: str) -> None:
    """The converter's config model refuses an unknown recipe and a misspelled field, and describes every field."""
    with pytest.raises(ValidationError, match="recipe"):
        config(recipe=bad_recipe)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        config(**{misspelled: ["w1"]})
    for name, field in config.model_fields.items():
        assert field.description, name
