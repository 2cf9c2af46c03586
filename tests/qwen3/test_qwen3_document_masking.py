"""Document masking in titan-qwen3 (dense and MoE): a packed window's logits equal each document run alone.

Documents are packed as the core packs them (``[BOS] tokens [EOS]``, back to back) and split
with the core's own ``split_documents``. Attention stays on ``F.scaled_dot_product_attention``,
with a boolean block-causal mask.

The MoE layer routes each token by its own router logits (top-k of logits + ``expert_bias``, a
buffer that moves only after an optimizer step) with no capacity and no dropped tokens, so a
token's experts do not depend on the other tokens of the batch: the comparison holds for the MoE
flavor as it is, with the balancing bias update on. (The auxiliary loss is per sequence, but it is
a loss term, not part of the logits.)
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from titan_core import IGNORE_INDEX, split_documents
from titan_qwen3.model import Qwen3Args, Transformer

from conftest import write_uneven_corpus

BOS, EOS, VOCAB = 1, 2, 61
DENSE = Qwen3Args(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=VOCAB, intermediate_size=96,
                  rope_theta=10000.0, max_seq_len=64)
MOE = replace(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, moe_bias_update_rate=0.1)
FLAVORS = {"dense": DENSE, "moe": MOE}


def _document(length: int, generator: torch.Generator) -> torch.Tensor:
    body = torch.randint(3, VOCAB, (length - 2,), generator=generator)
    return torch.cat([torch.tensor([BOS]), body, torch.tensor([EOS])])


def _rows() -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Two windows of 63 inputs (+1 label): the first starts at a document's EOS (a 1-token document),
    then documents of several lengths, the last cut by the window's end; the second is one document.
    Also the lengths of the documents of each row, as a reader cuts them (after each EOS)."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.cat([_document(n, g) for n in lengths])[skip : skip + 64]
            for lengths, skip in (([9, 5, 2, 30, 40], 8), ([64], 0))]
    window = torch.stack(rows)
    inputs, labels = window[:, :-1], window[:, 1:]
    lengths = []
    for row in inputs:
        ends = (row == EOS).nonzero().flatten().tolist()
        bounds = [0, *[e + 1 for e in ends if e + 1 < len(row)], len(row)]
        lengths.append([b - a for a, b in zip(bounds, bounds[1:])])
    return inputs, labels, lengths


def _model(flavor: str) -> Transformer:
    model = Transformer(FLAVORS[flavor])
    model.init_weights(seed=1)
    if FLAVORS[flavor].num_experts:  # a trained router is biased: the bias must act per token too
        for block in model.layers.values():
            block.moe.router.expert_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    return model


@pytest.mark.parametrize("flavor", FLAVORS)
def test_packed_window_logits_equal_each_document_alone(flavor: str) -> None:
    inputs, labels, lengths = _rows()
    model = _model(flavor)
    positions, _ = split_documents(inputs, labels, eos_id=EOS, bos_id=BOS)
    assert lengths == [[1, 5, 2, 30, 25], [63]]  # a 1-token document, and a row of one document
    # RoPE is relative: within a document, turning every token by the same extra angle leaves the logits
    # as they are, so the comparison below cannot see the rotary positions; the rotation each layer is
    # given is checked on its own.
    rotations: list[torch.Tensor] = []
    hook = model.layers["0"].attention.register_forward_pre_hook(lambda _, args: rotations.append(args[1]))
    with torch.no_grad():
        packed = model(inputs, positions=positions)
        hook.remove()
        unmasked = model(inputs)
        worst = 0.0
        for row, row_lengths in enumerate(lengths):
            offset = 0
            for n in row_lengths:
                alone = model(inputs[row : row + 1, offset : offset + n])[0]
                worst = max(worst, (packed[row, offset : offset + n] - alone).abs().max().item())
                # Each document's tokens turn by 0, 1, 2, ...: the table's first rows, as when run alone.
                assert torch.equal(rotations[0][:, row, offset : offset + n], model.rope[:, :n])
                offset += n
    print(f"{flavor}: largest |packed - alone| logit difference {worst:.2e}")
    assert worst < 1e-5, worst
    # Masking changes something: the later documents of the first row differ from the unmasked run.
    assert (packed[0, 20:] - unmasked[0, 20:]).abs().max() > 1e-2
    # The second row is one document from position 0: masking leaves it as it was.
    torch.testing.assert_close(packed[1], unmasked[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_masked_gradients_equal_the_sum_over_documents_alone(flavor: str) -> None:
    """The summed loss of a packed window (boundary labels ignored) has the gradient of the documents' own
    summed losses, on every parameter: nothing flows across documents, and everything flows within them."""
    inputs, labels, lengths = _rows()
    positions, masked = split_documents(inputs, labels, eos_id=EOS, bos_id=BOS)

    def summed_loss(model: Transformer, tokens: torch.Tensor, targets: torch.Tensor,
                    positions: torch.Tensor | None = None) -> torch.Tensor:
        logits = model(tokens, positions=positions)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                                 reduction="sum")

    packed_model, alone_model = _model(flavor), _model(flavor)
    summed_loss(packed_model, inputs, masked, positions).backward()
    for row, row_lengths in enumerate(lengths):
        offset = 0
        for n in row_lengths:
            piece = slice(offset, offset + n)
            summed_loss(alone_model, inputs[row : row + 1, piece], masked[row : row + 1, piece]).backward()
            offset += n
    packed = dict(packed_model.named_parameters())
    worst = 0.0
    for name, param in alone_model.named_parameters():
        ours = packed[name].grad
        assert ours is not None and param.grad is not None, name
        assert torch.isfinite(ours).all() and ours.abs().max() > 0, name
        worst = max(worst, float((ours - param.grad).norm() / param.grad.norm()))
        torch.testing.assert_close(ours, param.grad, atol=1e-5, rtol=1e-4, msg=name)
    print(f"{flavor}: largest relative gradient difference (norm) {worst:.2e}")


def test_pipeline_stages_take_the_positions_beside_the_hidden_states() -> None:
    """What pipeline_takes_positions=True promises: two stages cut by the core's splitter, each given the
    positions (the second with the first's hidden states), give the whole model's masked logits."""
    from titan_core.parallel.pipeline import build_stage_module

    inputs, labels, _ = _rows()
    positions, _ = split_documents(inputs, labels, eos_id=EOS, bos_id=BOS)
    model = _model("moe")
    first = build_stage_module(model, ["0"], is_first=True, is_last=False)
    last = build_stage_module(model, ["1"], is_first=False, is_last=True)
    with torch.no_grad():
        hidden = first(inputs, positions=positions)
        assert hidden.shape == (2, 63, MOE.dim)
        torch.testing.assert_close(last(hidden, positions=positions), model(inputs, positions=positions),
                                   atol=1e-6, rtol=0)
        with pytest.raises(ValueError, match=r"positions \(2, 62\) are not \[batch, seq\] = \(2, 63\) of the "
                                             r"input \(2, 63, 64\)"):
            last(hidden, positions=positions[:, 1:])


def test_positions_of_another_shape_or_type_are_refused_clearly() -> None:
    inputs, labels, _ = _rows()
    model = _model("dense")
    positions, _ = split_documents(inputs, labels, eos_id=EOS, bos_id=BOS)
    with pytest.raises(ValueError, match=r"positions \(2, 62\) are not \[batch, seq\] = \(2, 63\) of the input "
                                         r"\(2, 63\): pass one position per token"):
        model(inputs, positions=positions[:, 1:])
    with pytest.raises(ValueError, match=r"positions \(63,\) are not \[batch, seq\] = \(2, 63\)"):
        model(inputs, positions=positions[0])
    with pytest.raises(ValueError, match=r"positions are torch.float32: they must be integers"):
        model(inputs, positions=positions.float())


def test_titan_train_qwen3_with_document_masking_runs_three_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The real CLI (in this process), MoE flavor: the trainer hands qwen3 the positions of many documents.

    On a corpus of short documents: the built-in data's 64-token windows hold a single document each (its
    documents are whole files), where masking would change nothing."""
    from titan_core.commands.titan_train import main

    documents_per_row: list[float] = []
    forward = Transformer.forward

    @functools.wraps(forward)  # keeps the signature the core inspects for `positions`
    def counting(self: Transformer, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        assert positions is not None, "document_masking=true, but the trainer passed no positions"
        documents_per_row.append(float((positions == 0).sum(dim=1).float().mean()))
        return forward(self, tokens, positions)

    monkeypatch.setattr(Transformer, "forward", counting)
    corpus = write_uneven_corpus(tmp_path / "docs.jsonl", seed=0, documents=300, longest=50)
    code = main(["--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--training.seq_len=64",
                 "--training.local_batch_size=2", "--training.steps=3", "--metrics.log_freq=1",
                 "--lr_scheduler.warmup_steps=1", "--metrics.report=false", "--data.document_masking=true",
                 f"--data.source={corpus}", f"--job.run_dir={tmp_path / 'run'}"])
    text = "".join(capsys.readouterr())
    assert code == 0, text
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(loss) and loss > 0 for loss in losses), losses
    assert len(documents_per_row) >= 3 and min(documents_per_row) > 1, documents_per_row  # several per row
