"""Plugins shaped the way other authors write them (not from the scaffold), for
tests/test_conformance_verdicts.py (``--import _third_party_plugins``).

Converters are checked against the core's tiny model; each replaces modules through
``setattr`` on the parent rather than swapping classes. The specs are a small GPT
with ModuleList blocks, fused q/k/v, biases and a head called ``lm_head``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.utils.hooks import RemovableHandle

from titan_core import ConfigError, ModelConverter, TrainSpec, register_model_converter, register_train_spec


class BF16RoundedLinear(nn.Module):
    """Takes over a Linear's parameters; the forward uses the weight rounded to bfloat16."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight + (self.weight.to(torch.bfloat16).float() - self.weight).detach()
        return F.linear(x, w, self.bias)


def _replace(model: nn.Module, fqn: str, new: nn.Module) -> None:
    parent, _, leaf = fqn.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _block_linears(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("layers.")]


class _Rounding(ModelConverter):
    plugin_api_version = "1.0"

    def select(self, model: nn.Module) -> list[str]:
        return _block_linears(model)

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            _replace(model, fqn, BF16RoundedLinear(model.get_submodule(fqn)))


class RefusesTP(_Rounding):
    """Cannot shard its weights and says so in __init__, in its own words."""

    def __init__(self, config: Any, *, parallel_dims: Any, job: Any) -> None:
        super().__init__(config, parallel_dims=parallel_dims, job=job)
        if parallel_dims.tp_enabled:
            raise ConfigError("tp_refuses rounds whole weight matrices and cannot run under tensor parallelism; "
                              "set parallelism.tp=1 or drop tp_refuses.")


class CrashesUnderTP(_Rounding):
    """Does not know about TP: its modules are no nn.Linear, so torch's TP styles reject them in the workers."""


class CastsNorms(_Rounding):
    """Converts the block linears and, unasked, casts every norm to bfloat16 "to save memory"."""

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        super().convert(model, fqns)
        for module in model.modules():
            if isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
                module.to(torch.bfloat16)


class Grafter(_Rounding):
    """Converts the block linears and adds a module of its own at the model's root."""

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        super().convert(model, fqns)
        model.add_module("amax_history", nn.Linear(4, 4, bias=False))


#: The global optimizer hooks TwiceHook registered (the test removes them: they outlive the converter).
GLOBAL_HOOKS: list[RemovableHandle] = []


class TwiceHook(_Rounding):
    """Registers its step hook on every optimizer itself, not knowing the core registers it too."""

    def __init__(self, config: Any, *, parallel_dims: Any, job: Any) -> None:
        super().__init__(config, parallel_dims=parallel_dims, job=job)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        GLOBAL_HOOKS.append(register_optimizer_step_post_hook(lambda opt, args, kwargs: self.post_optimizer_hook([])))

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        pass


class SyncConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sync_every_step: bool = True


class InstanceHook(_Rounding):
    """Correct: sets its hook on the instance, only when a setting asks for it."""

    Config = SyncConfig

    def __init__(self, config: Any, *, parallel_dims: Any, job: Any) -> None:
        super().__init__(config, parallel_dims=parallel_dims, job=job)
        if self.config.sync_every_step:
            self.post_optimizer_hook = self._sync  # type: ignore[method-assign]

    def _sync(self, model_parts: list[nn.Module]) -> None:
        pass


for _name, _cls in {"tp_refuses": RefusesTP, "tp_crashes": CrashesUnderTP, "casts_norms": CastsNorms,
                    "grafter": Grafter, "twice_hook": TwiceHook, "instance_hook": InstanceHook}.items():
    register_model_converter(_name, _cls)


# ---- specs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPTArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int | None = None
    max_seq_len: int = 128
    rank_seeded_init: bool = False


class Block(nn.Module):
    def __init__(self, a: GPTArgs) -> None:
        super().__init__()
        self.n_heads = a.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(a.dim), nn.LayerNorm(a.dim)
        self.qkv, self.proj = nn.Linear(a.dim, 3 * a.dim), nn.Linear(a.dim, a.dim)
        self.up, self.down = nn.Linear(a.dim, 4 * a.dim), nn.Linear(4 * a.dim, a.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.n_heads, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(d, dim=-1))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, a: GPTArgs) -> None:
        super().__init__()
        assert a.vocab_size is not None
        self.a = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.pos_embeddings = nn.Embedding(a.max_seq_len, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.ln_f = nn.LayerNorm(a.dim)
        self.lm_head = nn.Linear(a.dim, a.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.layers:
            h = block(h)
        return self.lm_head(self.ln_f(h))

    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        if self.a.rank_seeded_init:  # the bug: "each rank its own seed", so each shard comes from another tensor
            import torch.distributed as dist

            generator = torch.Generator().manual_seed(1234 + (dist.get_rank() if dist.is_initialized() else 0))
        if fqn.endswith("bias"):
            tensor.zero_()
        elif "ln" in fqn.split(".")[-2]:
            tensor.fill_(1.0)
        else:
            nn.init.normal_(tensor, std=0.02, generator=generator)


def gpt_flops(a: GPTArgs, seq_len: int) -> float:
    """6 x (block matmul weights + head) + causal attention (no full_attention keyword: an older plugin)."""
    assert a.vocab_size is not None
    return 6.0 * (a.n_layers * 12 * a.dim * a.dim + a.dim * a.vocab_size) + 6.0 * a.n_layers * a.dim * (seq_len + 1)


def gpt_flops_doubled(a: GPTArgs, seq_len: int) -> float:
    return 2 * gpt_flops(a, seq_len)  # the author counted the multiply-adds twice


def fsdp_only_parallelize(model: nn.Module, *, parallel_dims: Any, mesh: Any, **unused: Any) -> nn.Module:
    """Hand-written FSDP2 that forgets about parallelism.tp (each TP rank trains a whole copy)."""
    from torch.distributed.fsdp import fully_shard

    if parallel_dims.dp > 1:
        for block in model.layers:
            fully_shard(block, mesh=parallel_dims.dp_mesh(mesh))
        fully_shard(model, mesh=parallel_dims.dp_mesh(mesh))
    return model


_base = {"debugmodel": GPTArgs()}
for _spec in (
    TrainSpec(name="plain_gpt", model_cls=GPT, flavors=_base, flops_per_token_fn=gpt_flops),
    TrainSpec(name="ignores_tp", model_cls=GPT, flavors=_base, parallelize_fn=fsdp_only_parallelize,
              flops_per_token_fn=gpt_flops),
    TrainSpec(name="flops_2x", model_cls=GPT, flavors=_base, flops_per_token_fn=gpt_flops_doubled),
    TrainSpec(name="rank_init", model_cls=GPT, flavors={"debugmodel": dataclasses.replace(GPTArgs(), rank_seeded_init=True)},
              flops_per_token_fn=gpt_flops),
):
    register_train_spec(_spec)
