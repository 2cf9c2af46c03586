"""Model-agnostic building blocks shared by decoder plugins (titan-llama, titan-qwen3, ...).

Only what is the same to the letter in several model files lives here: the SwiGLU
feed-forward, the truncated-normal init and the depth-scaled std of the residual
projections, the tied-head declaration, and the config fields every decoder section has.
A model's own choices (its norm, its rotary layout, its attention) stay in its one file.
A leaf: imports nothing of titan_core but runtime.torch_compat (itself a leaf), so a plugin's model file can import it freely.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..runtime.torch_compat import trunc_normal_ as compat_trunc_normal_


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), bias-free (Llama, Qwen3, and Qwen3-MoE's shared experts)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


def trunc_normal_(tensor: torch.Tensor, std: float, generator: torch.Generator) -> None:
    """Fill ``tensor`` from N(0, std) truncated at 3 std, drawn from ``generator``."""
    compat_trunc_normal_(tensor, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)


def residual_std(fqn: str, base: float = 0.02) -> float:
    """The init std of a projection writing into the residual stream of layer ``layers.<i>``:
    ``base / sqrt(2 (i + 1))``, so deeper layers start smaller."""
    parts = fqn.split(".")
    layer_id = int(parts[parts.index("layers") + 1])
    return base / math.sqrt(2 * (layer_id + 1))


def tied_head(tie_embeddings: bool) -> list[tuple[str, str]]:
    """A model's ``tied_weights()`` when the output head may be the embedding table:
    (source, alias) parameter names that are one tensor, which the core keeps tied."""
    return [("tok_embeddings.weight", "output.weight")] if tie_embeddings else []


class DecoderSection(BaseModel):
    """The config fields every decoder spec's section has; a field left ``None`` keeps the flavor's value.

    A spec's section subclasses it and adds its own knobs.
    """

    model_config = ConfigDict(extra="forbid")

    norm_eps: float | None = Field(None, gt=0, description="RMSNorm epsilon (default: the flavor's).")
    max_seq_len: int | None = Field(None, gt=0, description="Longest sequence the RoPE table covers (default: the flavor's).")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base frequency (default: the flavor's).")
    n_layers: int | None = Field(None, gt=0, description="Number of transformer blocks (default: the flavor's).")
    vocab_size: int | None = Field(None, gt=0, description="Vocabulary size (default: the flavor's, or the tokenizer's).")


def output_head(embedding: nn.Embedding, tie_embeddings: bool) -> nn.Linear:
    """The bias-free output head over ``embedding``'s vocabulary; tied, its weight is the table itself."""
    vocab_size, dim = embedding.weight.shape
    head = nn.Linear(dim, vocab_size, bias=False)
    if tie_embeddings:
        head.weight = embedding.weight
    return head


class HeadRequest:
    """Filled by :func:`final_norm_and_head` when the core asked for the final hidden states:
    ``head`` is then the output head the forward did not apply (the core applies it per chunk
    of tokens with the loss, so the full logits are never held at once)."""

    def __init__(self) -> None:
        self.head: nn.Module | None = None


_HEAD_REQUEST: ContextVar[HeadRequest | None] = ContextVar("titan_core_head_request", default=None)


@contextlib.contextmanager
def hidden_states_for_loss() -> Iterator[HeadRequest]:
    """Within this block, a forward that ends in :func:`final_norm_and_head` returns the normed
    hidden states and leaves its head in the yielded request. A model that does not end that way
    returns logits as always (``request.head`` stays None): the capability is opt-in by use."""
    request = HeadRequest()
    token = _HEAD_REQUEST.set(request)
    try:
        yield request
    finally:
        _HEAD_REQUEST.reset(token)


def head_was_handed_over() -> bool:
    """Whether the forward that just ran inside :func:`hidden_states_for_loss` returned hidden states (its head
    handed to the core) rather than logits."""
    request = _HEAD_REQUEST.get()
    return request is not None and request.head is not None


def final_norm_and_head(h: torch.Tensor, norm: nn.Module | None, output: nn.Module | None) -> torch.Tensor:
    """The end of a decoder's forward: the final norm, then the head (logits). A pipeline stage
    the splitter left without them returns what it has (hidden states). Inside
    :func:`hidden_states_for_loss` the head is handed to the core instead of applied."""
    if norm is not None:
        h = norm(h)
    if output is None:
        return h
    request = _HEAD_REQUEST.get()
    if request is not None:
        request.head = output
        return h
    out: torch.Tensor = output(h)
    return out


def init_decoder_parameter(fqn: str, tensor: torch.Tensor, generator: torch.Generator, *, dim: int,
                           embedding_std: float) -> None:
    """Fill ``tensor`` (full-shaped, plain) with the initial value of decoder parameter ``fqn``, by the
    module that owns it: the embedding N(0, embedding_std), norms 1, the input projections (q/k/v,
    w1/w3, a router's gate) std 0.02, the residual writers (wo, w2) ``residual_std``, the head dim^-0.5.
    Stacked expert weights (``experts.w1`` ...) follow the rule of their name."""
    parts = fqn.split(".")
    owner = parts[-2] if len(parts) >= 2 else ""
    if owner == "experts":
        owner = parts[-1]
    if owner == "tok_embeddings":
        nn.init.normal_(tensor, mean=0.0, std=embedding_std, generator=generator)
    elif owner.endswith("norm"):
        nn.init.ones_(tensor)
    elif owner in ("wq", "wk", "wv", "w1", "w3", "gate"):
        trunc_normal_(tensor, 0.02, generator)
    elif owner in ("wo", "w2"):
        trunc_normal_(tensor, residual_std(fqn), generator)
    elif owner == "output":
        trunc_normal_(tensor, dim**-0.5, generator)
    else:
        raise ValueError(f"Transformer.init_parameter: no init rule for parameter {fqn!r}")

