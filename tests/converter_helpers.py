"""What the float8 and MX converter tests share: a tiny Llama, materialising on CPU, the
"same as torchao's own API" check, and a short training loop."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.config.sections import CompileSection, ParallelismSection, TrainingSection
from titan_core.protocols import RunContext
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
