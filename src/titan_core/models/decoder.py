"""What the decoder plugins share beyond ``model_parts``: the token embedding built once the vocabulary
is known, the RMSNorm computed in float32 (titan-qwen3, titan-deepseek), their models' base class
(``DecoderModel``: embedding, blocks, final norm and head; the tied-head declaration, the per-parameter
init, ``init_weights``), and the parameter and FLOP counts of a pre-norm stack of dense and MoE layers.

Imports only ``model_parts`` at module import (``models.init``, which imports DTensor, on the first
``init_weights`` call), so a plugin's model file imports it freely and ``titan-train --list`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from .model_parts import init_decoder_parameter, output_head, tied_head

__all__ = ["DecoderModel", "RMSNorm", "decoder_flops_per_token", "decoder_parameter_counts", "token_embedding"]


class DecoderShape(Protocol):
    """The two fields of a model-args dataclass that size its embedding."""

    @property
    def vocab_size(self) -> int | None: ...

    @property
    def dim(self) -> int: ...


def token_embedding(args: DecoderShape) -> nn.Embedding:
    """The ``vocab_size x dim`` token embedding of a model built from ``args``; a ValueError naming the args'
    class while ``vocab_size`` is still None (the core fills it from the tokenizer before building)."""
    if args.vocab_size is None:
        raise ValueError(f"{type(args).__name__}.vocab_size is None: fill it (from the tokenizer) before building "
                         f"the model")
    return nn.Embedding(args.vocab_size, args.dim)


class DecoderModel(nn.Module):
    """What titan's decoders (titan-llama, titan-qwen3, titan-deepseek) build and define alike: the base
    class of a model whose ``args`` has ``dim``, ``n_layers``, ``vocab_size`` and ``tie_embeddings``."""

    # init_parameter draws each value by the parameter's name alone (never its shape): the core may fill a
    # large parameter tile by tile, and a rank then draws only its own shard's tiles (models/init.py).
    init_is_elementwise = True

    # None where the pipeline splitter removed them from a stage.
    tok_embeddings: nn.Embedding | None
    layers: nn.ModuleDict
    norm: nn.Module | None
    output: nn.Linear | None

    def __init__(self, args: Any, block: Callable[[int], nn.Module], norm: nn.Module) -> None:
        """Keep ``args``, then set ``tok_embeddings``, ``layers`` (``block(i)`` for each layer i), the final
        ``norm`` and the ``output`` head (tied to the embedding table with ``args.tie_embeddings``), in that
        order: the order of the state dict's keys."""
        super().__init__()
        self.args = args
        self.tok_embeddings = token_embedding(args)
        # A ModuleDict keyed "0".."n-1", not a ModuleList, so that a pipeline stage keeps the original
        # names (and checkpoint keys) of the layers it holds.
        self.layers = nn.ModuleDict({str(i): block(i) for i in range(args.n_layers)})
        self.norm = norm
        self.output = output_head(self.tok_embeddings, args.tie_embeddings)

    def tied_weights(self) -> list[tuple[str, str]]:
        """(source, alias) parameter names that are one tensor; the core keeps them tied."""
        return tied_head(self.args.tie_embeddings)

    def init_parameter(self, fqn: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """Fill ``tensor`` (full-shaped, plain) with the initial value of parameter ``fqn``."""
        # Untied, the embedding starts at unit scale (as torchtitan starts it). At 0.02 the token's own
        # vector is a sliver of the residual stream, every token's hidden state is nearly the same for
        # the first tens of steps, and a MoE router sends them all to the same experts (Qwen3's
        # debugmoe: max/mean load 3.9 at step 20). Tied, the table is also the head: small, as Hugging
        # Face initialises these models (initializer_range 0.02).
        embedding_std = 0.02 if self.args.tie_embeddings else 1.0
        init_decoder_parameter(fqn, tensor, generator, dim=self.args.dim, embedding_std=embedding_std)

    def init_weights(self, seed: int = 0) -> None:
        """Initialise a plain (not distributed) model in place; the same seed gives the same weights anywhere.

        The core's own init, which also fills sharded models: a plain and a sharded model built with
        one seed hold the same weights.
        """
        from .init import init_model_weights  # imports DTensor: not at module import (--list)

        init_model_weights(self, seed=seed)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, computed in float32 (Qwen3, DeepSeek-V3)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = self.weight * h.type_as(x)
        return out


def decoder_parameter_counts(*, vocab_size: int, dim: int, tie_embeddings: bool, attention: int, sparse: list[bool],
                             dense_hidden: int, num_experts: int, experts_per_token: int, expert_hidden: int,
                             shared_hidden: int) -> tuple[int, int]:
    """(total, active per token) parameters of a decoder whose layer i is a MoE layer when ``sparse[i]``,
    embedding and head included (a tied head counted once). ``attention``: one block's attention weights
    and norms; each MLP is SwiGLU (3 matrices), a MoE layer's router ``dim x num_experts`` plus its experts
    (``experts_per_token`` of them active) and its shared experts (``shared_hidden`` wide, 0: none)."""
    expert = 3 * dim * expert_hidden
    shared = 3 * dim * shared_hidden
    total = active = vocab_size * dim * (1 if tie_embeddings else 2) + dim
    for is_sparse in sparse:
        total += attention
        active += attention
        if is_sparse:
            router = dim * num_experts
            total += router + num_experts * expert + shared
            active += router + experts_per_token * expert + shared
        else:
            total += 3 * dim * dense_hidden
            active += 3 * dim * dense_hidden
    return total, active


def decoder_flops_per_token(active: int, *, vocab_size: int, dim: int, tie_embeddings: bool, seq_len: int,
                            full_attention: bool, attention_per_key: float) -> float:
    """Training FLOPs per token: 6 x the ``active`` parameters less the embedding (the head's matmul counted,
    tied or not), plus ``attention_per_key`` (all layers' score and value matmuls per key) times the keys a
    query attends to: (seq_len + 1) / 2 on average under the causal mask, or seq_len (``full_attention``)."""
    non_embedding = active - vocab_size * dim * (0 if tie_embeddings else 1)
    keys_per_query = seq_len if full_attention else (seq_len + 1) / 2
    return 6.0 * non_embedding + attention_per_key * keys_per_query
