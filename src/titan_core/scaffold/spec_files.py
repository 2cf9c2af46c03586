"""The files of a new model package (``titan-plugin new spec NAME``); ``$name`` etc. are filled in."""

PYPROJECT = '''[build-system]
requires = ["hatchling>=1.18"]
build-backend = "hatchling.build"

[project]
name = "$dist"
version = "0.1.0"
description = "A titan-core model plugin (spec $name)"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["titan-core>=0.1,<0.2", "torch>=2.13"]

[project.optional-dependencies]
test = ["pytest>=8"]

# What makes this a titan-core plugin: titan-train --spec $name imports $pkg.spec
# and reads its ${name}_spec attribute.
[project.entry-points."titan.train_specs"]
$name = "$pkg.spec:${name}_spec"

[tool.hatch.build.targets.wheel]
packages = ["src/$pkg"]
'''

INIT = '''"""$dist: a titan-core model plugin (entry point ``$name``)."""

from .model import ${Cls}Args, ${Cls}Model, flops_per_token
from .spec import ${Cls}Section, flavors, ${name}_spec

__all__ = ["${Cls}Args", "${Cls}Model", "${Cls}Section", "flavors", "flops_per_token", "${name}_spec"]
'''

MODEL = '''"""The $name model: a pre-norm causal decoder (RMSNorm, multi-head attention, SwiGLU MLP).

No parallelism and no config plumbing here: the model is built on the meta device,
then titan-core applies TP (from tp_plan.py), activation checkpointing, compile and
FSDP2, materializes it, and fills each parameter through ``init_parameter``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ${Cls}Args:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    hidden: int = 256
    vocab_size: int | None = None  # None: titan-core fills it from the tokenizer


class Attention(nn.Module):
    def __init__(self, a: ${Cls}Args) -> None:
        super().__init__()
        self.head_dim = a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, a.dim, bias=False)
        self.wv = nn.Linear(a.dim, a.dim, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # "-1" heads: under TP each rank holds only its own heads.
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return y


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, a: ${Cls}Args) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return y


class Block(nn.Module):
    def __init__(self, a: ${Cls}Args) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(a.dim)
        self.attention = Attention(a)
        self.ffn_norm = nn.RMSNorm(a.dim)
        self.feed_forward = FeedForward(a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = x + self.attention(self.attention_norm(x))
        y: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return y


class ${Cls}Model(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab]."""

    def __init__(self, a: ${Cls}Args) -> None:
        super().__init__()
        if a.vocab_size is None:
            raise ValueError("${Cls}Args.vocab_size is None: set it (titan-core fills it from the tokenizer)")
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        # A ModuleDict keyed "0".."n-1": titan-core's default parallelize_fn treats
        # model.layers as the blocks (checkpointed, compiled and sharded one by one).
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
        """Fill the full-shaped plain tensor of parameter ``fqn`` (titan-core seeds ``generator`` per name)."""
        if fqn.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif fqn.endswith(("wo.weight", "w2.weight")):
            # Layers writing into the residual stream start smaller, so its variance stays put.
            nn.init.normal_(tensor, std=0.02 / math.sqrt(2 * self.args.n_layers), generator=generator)
        else:
            nn.init.normal_(tensor, std=0.02, generator=generator)


def flops_per_token(a: ${Cls}Args, seq_len: int, *, full_attention: bool = False) -> float:
    """Training FLOPs per token: 6 x matmul weights + 12 x layers x dim x keys per query (causal
    attention computes about half the square; ``full_attention`` counts all of it)."""
    assert a.vocab_size is not None
    per_block = 4 * a.dim * a.dim + 3 * a.dim * a.hidden
    keys_per_query = seq_len if full_attention else (seq_len + 1) / 2
    return 6.0 * (a.n_layers * per_block + a.dim * a.vocab_size) + 12.0 * a.n_layers * a.dim * keys_per_query
'''

TP_PLAN = '''"""The tensor-parallel plan: ``{module name: ParallelStyle}`` for titan-core's default parallelize_fn.

Column-wise q/k/v, w1 and w3 (each rank computes its own heads and its slice of the MLP),
row-wise wo and w2 (all-reduced back to the replicated residual stream); the
embedding and the norms stay whole on every rank. The head is column-wise over the
vocabulary: with ``loss_parallel`` its logits stay a DTensor sharded on the last
dimension, which the core's loss consumes under ``loss_parallel()``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from titan_core import TensorParallelStyles


def ${name}_tp_plan(model: nn.Module, *, styles: TensorParallelStyles, loss_parallel: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    plan: dict[str, Any] = {}
    for name, _ in model.get_submodule("layers").named_children():
        p = f"layers.{name}"
        plan.update({
            f"{p}.attention.wq": styles.colwise(), f"{p}.attention.wk": styles.colwise(),
            f"{p}.attention.wv": styles.colwise(), f"{p}.attention.wo": styles.rowwise(),
            f"{p}.feed_forward.w1": styles.colwise(), f"{p}.feed_forward.w2": styles.rowwise(),
            f"{p}.feed_forward.w3": styles.colwise(),
        })
    plan["output"] = ColwiseParallel(output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                     use_local_output=not loss_parallel)
    return plan
'''

SPEC = '''"""The $name TrainSpec: what the ``titan.train_specs`` entry point ``$name`` names.

Only the model, its flavors and a TP plan: parallelism is titan-core's default
parallelize_fn (TP -> activation checkpointing -> compile -> FSDP2), and the loss,
tokenizer, data, optimizer, LR schedule and metrics are the core's defaults.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from titan_core import ConfigError, ParallelismSection, TrainingSection, TrainSpec

from .model import ${Cls}Args, ${Cls}Model, flops_per_token
from .tp_plan import ${name}_tp_plan


class ${Cls}Section(BaseModel):
    """The ``[$name]`` config section: a field left None keeps the flavor's value."""

    model_config = ConfigDict(extra="forbid")

    n_layers: int | None = Field(None, gt=0, description="Number of blocks (default: the flavor's).")


flavors: dict[str, ${Cls}Args] = {
    "debugmodel": ${Cls}Args(dim=64, n_layers=2, n_heads=4, hidden=256),
    "small": ${Cls}Args(dim=768, n_layers=12, n_heads=12, hidden=3072),
}


def validate_${name}(args: Any, *, parallelism: ParallelismSection, training: TrainingSection, world_size: int) -> None:
    """Refuse layouts the model cannot take, before any process starts."""
    del training, world_size
    for what, value in (("n_heads", args.n_heads), ("hidden", args.hidden)):
        if value % parallelism.tp:
            raise ConfigError(f"parallelism.tp={parallelism.tp} does not divide $name {what}={value}; "
                              f"choose a tp degree that divides it.")


${name}_spec = TrainSpec(
    name="$name",
    model_cls=${Cls}Model,
    flavors=flavors,
    tp_plan_fn=${name}_tp_plan,
    # Per-op selective activation checkpointing keeps these outputs (every other matmul).
    selective_ac_save_ops=("aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                           "aten._scaled_dot_product_flash_attention.default",
                           "aten._scaled_dot_product_efficient_attention.default"),
    config_model=${Cls}Section,
    validate_fn=validate_${name},
    flops_per_token_fn=flops_per_token,
    plugin_api_version="1.0",  # the titan-core plugin API this spec was written for
)
'''

TEST = '''"""Run titan-core's conformance checks on this spec (what `titan-plugin check $name` runs)."""

from titan_core.testing import TrainSpecConformance


class Test${Cls}(TrainSpecConformance):
    train_spec = "$name"
    fast = True  # the quick subset; set False (or run `titan-plugin check $name`) for every check
'''

README = '''# $dist

A titan-core model plugin: `titan-train --spec $name` trains a small pre-norm causal
decoder with every parallelism titan-core offers (FSDP2 / HSDP, TP from `tp_plan.py`,
activation checkpointing, compile).

```bash
pip install .
titan-plugin check $name          # the conformance checks (add --fast for the quick subset)
titan-train --spec $name --flavor debugmodel --training.steps=20
```

Files: `pyproject.toml` (the `titan.train_specs` entry point), `src/$pkg/model.py` (the
model), `src/$pkg/tp_plan.py` (its TP plan), `src/$pkg/spec.py` (flavors, the `[$name]`
section, the TrainSpec), `tests/test_conformance.py` (the checks inside pytest:
`pip install .[test] && pytest`).
'''

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "src/$pkg/__init__.py": INIT,
    "src/$pkg/model.py": MODEL,
    "src/$pkg/tp_plan.py": TP_PLAN,
    "src/$pkg/spec.py": SPEC,
    "tests/test_conformance.py": TEST,
}
