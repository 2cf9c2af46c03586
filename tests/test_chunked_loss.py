"""The chunked cross-entropy (chunked_loss.py) against the full-logits loss, in float32.

Loss and gradients (hidden states, head weight, every parameter of a small Llama) must
agree within 1e-6 whatever the chunk size, with ignored labels and a tied head. The
distributed layouts (FSDP2 x 2, TP 2 with loss parallel) are compared with a one-process
full-logits run in test_token_loss.py, on real gloo processes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from titan_core import IGNORE_INDEX
from titan_core.models.model_parts import hidden_states_for_loss
from titan_core.train.chunked_loss import chunkable_head, chunked_cross_entropy, rows_per_chunk
from titan_llama.model import LlamaArgs, Transformer

pytestmark = pytest.mark.fast


def _case(seed: int = 0, *, b: int = 3, s: int = 29, d: int = 16, vocab: int = 61) -> tuple[torch.Tensor, torch.nn.Linear, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(d, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, d, generator=gen))
    hidden = torch.randn(b, s, d, generator=gen, requires_grad=True)
    labels = torch.randint(0, vocab, (b, s), generator=gen)
    labels[0, :7] = IGNORE_INDEX
    labels[2, -3:] = IGNORE_INDEX
    return hidden, head, labels


@pytest.mark.parametrize("chunk_tokens", [1, 10, 29, 1000])
def test_loss_and_gradients_equal_the_full_logits(chunk_tokens: int) -> None:
    hidden, head, labels = _case()
    valid = int(labels.ne(IGNORE_INDEX).sum())
    full = F.cross_entropy(head(hidden).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    want = torch.autograd.grad(full * 2.5, [hidden, head.weight])  # a scale downstream, as token weighting
    chunked = chunked_cross_entropy(hidden, head, labels, valid=valid, chunk_tokens=chunk_tokens)
    got = torch.autograd.grad(chunked * 2.5, [hidden, head.weight])
    assert abs(chunked.item() - full.item()) <= 1e-6 * full.item()
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= 1e-6 * float(w.abs().max()), float((g - w).abs().max())
    with torch.no_grad():  # validation: the value alone, chunk by chunk
        assert abs(float(chunked_cross_entropy(hidden, head, labels, valid=valid, chunk_tokens=chunk_tokens))
                   - float(full)) <= 1e-6 * float(full)


def test_backward_runs_once_and_no_valid_label_is_nan_as_the_plain_mean() -> None:
    hidden, head, labels = _case(1)
    loss = chunked_cross_entropy(hidden, head, labels, valid=int(labels.ne(IGNORE_INDEX).sum()), chunk_tokens=8)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward runs once per forward"):
        loss.backward()
    none = torch.full_like(labels, IGNORE_INDEX)
    assert math.isnan(float(chunked_cross_entropy(hidden, head, none, valid=0)))
    assert math.isnan(float(F.cross_entropy(head(hidden).flatten(0, 1), none.flatten(), ignore_index=IGNORE_INDEX)))


def test_chunk_size_follows_the_vocabulary() -> None:
    assert rows_per_chunk(128_256) == 130  # 2**24 logits: 64 MiB of float32
    assert rows_per_chunk(2_000) == 8388 and rows_per_chunk(2_000, 64) == 64
    assert chunkable_head(torch.nn.Linear(4, 5, bias=False)) and not chunkable_head(torch.nn.ReLU())


@pytest.mark.parametrize("tied", [False, True])
def test_a_llama_hands_its_head_over_and_every_gradient_matches(tied: bool) -> None:
    args = LlamaArgs(dim=32, n_layers=2, n_heads=4, vocab_size=97, multiple_of=32, max_seq_len=24,
                     tie_embeddings=tied)
    model = Transformer(args)
    model.init_weights(0)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 97, (2, 24), generator=gen)
    labels = torch.randint(0, 97, (2, 24), generator=gen)
    labels[1, :5] = IGNORE_INDEX
    full = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    full.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    with hidden_states_for_loss() as request:
        hidden = model(tokens)
    assert request.head is model.output and hidden.shape == (2, 24, 32)  # the normed hidden states
    chunked = chunked_cross_entropy(hidden, request.head, labels, valid=int(labels.ne(IGNORE_INDEX).sum()),
                                    chunk_tokens=7)
    chunked.backward()
    assert abs(chunked.item() - full.item()) <= 1e-6 * full.item()
    assert set(want) == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, grad in want.items():
        got = dict(model.named_parameters())[name].grad
        assert got is not None
        assert float((got - grad).abs().max()) <= 1e-6 * max(float(grad.abs().max()), 1e-3), name
    # Outside the request the same model returns logits, as before.
    assert model(tokens).shape == (2, 24, 97)


def test_a_converted_head_keeps_the_full_logits_path() -> None:
    """A converter's head (float8, MX: a subclass of nn.Linear) scales its input per call; chunked, it would
    quantize with per-chunk scales and train other numbers than the golden float8/mx curves."""

    class ConvertedLinear(torch.nn.Linear):
        pass

    assert not chunkable_head(ConvertedLinear(4, 5, bias=False))
