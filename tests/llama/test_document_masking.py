"""Document masking in titan-llama: a packed window's logits equal each document run alone.

Documents are packed as the core packs them (``[BOS] tokens [EOS]``, back to back) and
split with the core's own ``split_documents`` (data/documents.py). Every attention path
that runs on CPU is checked: the fused kernel (``auto``), its fallback when the kernel
cannot be built, SDPA with a dense mask, and FlexAttention (forward only: torch 2.13 runs
FlexAttention without gradients on CPU; on CUDA it is compiled, which this CPU suite
cannot run).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from titan_core import IGNORE_INDEX, split_documents
from titan_llama import cpu_attention
from titan_llama.model import LlamaArgs, Transformer

BOS, EOS, VOCAB = 1, 2, 61
ARGS = LlamaArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=VOCAB, multiple_of=32,
                 rope_theta=10000.0, max_seq_len=64)


def _document(length: int, generator: torch.Generator) -> torch.Tensor:
    body = torch.randint(3, VOCAB, (length - 2,), generator=generator)
    return torch.cat([torch.tensor([BOS]), body, torch.tensor([EOS])])


def _rows() -> tuple[torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    """Two windows of 63 inputs (+1 label): the first starts at a document's EOS (a 1-token
    document), then documents of several lengths, the last cut by the window's end; the
    second is one document."""
    g = torch.Generator().manual_seed(0)
    rows, pieces = [], []
    for lengths, skip in (([9, 5, 2, 30, 40], 8), ([64], 0)):
        stream = torch.cat([_document(n, g) for n in lengths])[skip : skip + 64]
        rows.append(stream)
    window = torch.stack(rows)
    inputs, labels = window[:, :-1], window[:, 1:]
    for row in inputs:  # the documents as a reader would cut them: after each EOS
        ends = (row == EOS).nonzero().flatten().tolist()
        bounds = [0, *[e + 1 for e in ends if e + 1 < len(row)], len(row)]
        pieces.append([row[a:b] for a, b in zip(bounds, bounds[1:])])
    return inputs, labels, pieces


def _model(kernel: str) -> Transformer:
    model = Transformer(dataclasses.replace(ARGS, attention_kernel=kernel))
    model.init_weights(seed=1)
    return model


def test_split_documents_positions_and_ignored_labels() -> None:
    inputs = torch.tensor([[7, EOS, BOS, 5, 6, EOS, BOS, 9], [BOS, 3, 4, 5, 6, 7, 8, EOS]])
    labels = torch.tensor([[EOS, BOS, 5, 6, EOS, BOS, 9, 9], [3, 4, 5, 6, 7, 8, EOS, BOS]])
    positions, masked = split_documents(inputs, labels, eos_id=EOS, bos_id=BOS)
    assert positions.tolist() == [[0, 1, 0, 1, 2, 3, 0, 1], list(range(8))]
    assert masked.tolist() == [[EOS, IGNORE_INDEX, 5, 6, EOS, IGNORE_INDEX, 9, 9],
                               [3, 4, 5, 6, 7, 8, EOS, IGNORE_INDEX]]
    assert labels[0, 1] == BOS  # the caller's labels are not modified


def test_split_documents_when_bos_is_eos() -> None:
    # GPT-2 style: one token opens and closes documents; only the first of a pair ends one.
    T = 0
    inputs = torch.tensor([[T, 5, 6, T, T, 7, T, T]])
    labels = torch.tensor([[5, 6, T, T, 7, T, T, 8]])
    positions, masked = split_documents(inputs, labels, eos_id=T, bos_id=T)
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0]]
    assert masked.tolist() == [[5, 6, T, IGNORE_INDEX, 7, T, IGNORE_INDEX, 8]]


@pytest.fixture(params=["fused", "fused-fallback", "sdpa", "flex"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fused":
        assert cpu_attention.load_kernel(ARGS.head_dim) is not None, "the fused kernel must build on this machine"
    if request.param == "fused-fallback":
        monkeypatch.setattr(cpu_attention, "load_kernel", lambda head_dim: None)
    return {"fused": "auto", "fused-fallback": "auto"}.get(request.param, request.param)


def test_packed_window_logits_equal_each_document_alone(kernel: str) -> None:
    inputs, labels, documents = _rows()
    model = _model(kernel)
    positions, _ = split_documents(inputs, labels, eos_id=EOS, bos_id=BOS)
    assert [len(d) for d in documents[0]] == [1, 5, 2, 30, 25] and len(documents[1]) == 1  # a 1-token one too
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FlexAttention's "not compiled" advice
        packed = model(inputs, positions=positions)
        unmasked = model(inputs)
        worst = 0.0
        for row, docs in enumerate(documents):
            offset = 0
            for doc in docs:
                alone = model(doc[None])[0]
                worst = max(worst, (packed[row, offset : offset + len(doc)] - alone).abs().max().item())
                offset += len(doc)
    assert worst < 1e-5, worst
    # Masking changes something: later documents of the first row differ from the unmasked run.
    assert (packed[0, 20:] - unmasked[0, 20:]).abs().max() > 1e-2
    # The second row is one document: masking leaves it as it was.
    torch.testing.assert_close(packed[1], unmasked[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", ["auto", "fused", "sdpa"])
def test_masked_training_gradients_agree_across_kernels(kernel: str) -> None:
    """The fused kernel's masked backward against SDPA's (and the fallback's) on every parameter."""
    inputs, labels, _ = _rows()
    positions, masked_labels = split_documents(inputs, labels, eos_id=EOS, bos_id=BOS)

    def grads(model: Transformer) -> dict[str, torch.Tensor]:
        logits = model(inputs, positions=positions)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), masked_labels.flatten(), ignore_index=IGNORE_INDEX).backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    ours, reference = grads(_model(kernel)), grads(_model("sdpa"))
    assert ours.keys() == reference.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], atol=2e-6, rtol=1e-4, msg=name)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Block-causal attention by its definition, float64, [b, s, h, d]."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    i = torch.arange(q.shape[1])
    visible = (i[None, :] <= i[:, None])[None] & (i[None, None, :] >= starts[:, :, None])
    return torch.einsum("bhij,bjhd->bihd", scores.masked_fill(~visible[:, None], -math.inf).softmax(-1), v)


@pytest.mark.parametrize("lengths", [[5, 70, 1, 60, 64], [130, 70], [200]], ids=["many", "two", "one"])
def test_fused_kernel_block_causal_forward_and_backward(lengths: list[int]) -> None:
    """200 tokens: documents that start inside, across and at the kernel's 64-key backward tiles."""
    g = torch.Generator().manual_seed(2)
    q, k, v, grad = (torch.randn(2, 200, h, 16, generator=g) for h in (4, 2, 2, 4))
    positions = torch.cat([torch.arange(n) for n in lengths]).expand(2, -1)
    starts = cpu_attention.document_starts(positions)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, _ = cpu_attention.causal_attention(q, k, v, starts)
    out.backward(grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _reference(q64, k64, v64, starts)
    ref.backward(grad.double())
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-5, rtol=1e-5)
    for ours, theirs in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(ours.double(), theirs, atol=5e-5, rtol=1e-5)


def test_fused_kernel_refuses_starts_that_are_not_block_causal() -> None:
    q = torch.randn(1, 8, 2, 16)
    for bad in ([0, 0, 0, 4, 0, 0, 0, 0], [0, 0, 3, 3, 3, 3, 3, 3], [-1, 0, 0, 0, 0, 0, 0, 0]):
        with pytest.raises(ValueError, match="document starts"):
            cpu_attention.causal_attention(q, q, q, torch.tensor([bad]))


def test_positions_of_one_document_change_nothing() -> None:
    inputs, _, _ = _rows()
    model = _model("auto")
    with torch.no_grad():
        plain = model(inputs)
        one_document = model(inputs, positions=torch.arange(inputs.shape[1]).expand_as(inputs))
    torch.testing.assert_close(one_document, plain, atol=1e-6, rtol=0)
