"""``tiny``: the core's own small decoder, the model converters are checked against by default.

Importing this module registers the spec (``--import titan_core.testing.tiny_spec``),
so subprocess runs of the conformance kit find it without any installed model plugin.
It uses only the core's defaults: ``default_parallelize_fn`` with the TP plan below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..discovery import register_train_spec
from ..protocols import TensorParallelStyles, TrainSpec


@dataclass(frozen=True)
class TinyArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    hidden: int = 256
    vocab_size: int | None = None


class Attention(nn.Module):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.head_dim = a.dim // a.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(a.dim, a.dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out: torch.Tensor = self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))
        return out


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class Block(nn.Module):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(a.dim)
        self.attention = Attention(a)
        self.ffn_norm = nn.RMSNorm(a.dim)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = x + self.attention(self.attention_norm(x))
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class TinyTransformer(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab]; causal, no position embedding beyond attention order."""

    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        assert a.vocab_size is not None, "vocab_size is filled from the tokenizer"
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleDict({str(i): Block(a) for i in range(a.n_layers)})
        self.norm = nn.RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h)
        logits: torch.Tensor = self.output(self.norm(h))
        return logits

    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        if fqn.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif fqn.endswith(("wo.weight", "w2.weight")):
            nn.init.normal_(tensor, std=0.02 / math.sqrt(2 * self.args.n_layers), generator=generator)
        else:
            nn.init.normal_(tensor, std=0.02, generator=generator)


def tiny_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    """Column-wise q/k/v/w1/w3, row-wise wo/w2; norms and embedding whole on every rank; vocab-sharded head."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    plan: dict[str, Any] = {}
    for name, _ in model.get_submodule("layers").named_children():
        p = f"layers.{name}"
        plan.update({f"{p}.attention.wq": styles.colwise(), f"{p}.attention.wk": styles.colwise(),
                     f"{p}.attention.wv": styles.colwise(), f"{p}.attention.wo": styles.rowwise(),
                     f"{p}.feed_forward.w1": styles.colwise(), f"{p}.feed_forward.w2": styles.rowwise(),
                     f"{p}.feed_forward.w3": styles.colwise()})
    plan["output"] = ColwiseParallel(output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                     use_local_output=not loss_parallel)
    return plan


def matmul_flops_per_token(args: TinyArgs, seq_len: int, *, full_attention: bool = False) -> float:
    """6 x matmul weights + 12 x layers x dim x keys per query (causal: (seq_len + 1) / 2 on average;
    ``full_attention``: the whole square, as published MFU figures count it)."""
    assert args.vocab_size is not None
    per_block = 4 * args.dim * args.dim + 3 * args.dim * args.hidden
    keys_per_query = seq_len if full_attention else (seq_len + 1) / 2
    return 6.0 * (args.n_layers * per_block + args.dim * args.vocab_size) + 12.0 * args.n_layers * args.dim * keys_per_query


TINY_SPEC = TrainSpec(
    name="tiny",
    model_cls=TinyTransformer,
    flavors={"debugmodel": TinyArgs()},
    tp_plan_fn=tiny_tp_plan,
    selective_ac_save_ops=("aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default"),
    flops_per_token_fn=matmul_flops_per_token,
)

register_train_spec(TINY_SPEC)  # registering the same object again is a no-op
