"""[stability] units: the z-loss's gradient on the plain and the chunked loss paths, the spike guard's rule and
window, and the section's checks (train/z_loss.py, train/chunked_loss.py, train/spike_guard.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

COEFF = 0.05  # large, so the z-loss's share of the gradient is far above the tolerance


def _case() -> tuple[torch.Tensor, nn.Linear, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 7, 8, generator=gen) * 3  # logits of a few units: logsumexp well away from 0
    head = nn.Linear(8, 11, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(11, 8, generator=gen))
    labels = torch.randint(0, 11, (2, 7), generator=gen)
    labels[0, :3] = -100  # ignored labels take no part in either term
    return hidden, head, labels


def _by_autograd(coeff: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cross-entropy, z-loss, d/dhidden, d/dweight) of cross-entropy + coeff * mean over valid of lse**2."""
    from titan_core.models.loss import cross_entropy_loss

    hidden, head, labels = _case()
    hidden.requires_grad_()
    logits = head(hidden)
    valid = labels.ne(-100)
    z = coeff * torch.logsumexp(logits, dim=-1)[valid].square().mean()
    ce = cross_entropy_loss(logits, labels)
    (ce + z).backward()
    assert hidden.grad is not None and head.weight.grad is not None
    return ce.detach(), z.detach(), hidden.grad, head.weight.grad


def test_the_chunked_loss_gradient_with_z_loss_equals_autograd_on_the_plain_path() -> None:
    from titan_core.train.chunked_loss import chunked_cross_entropy_and_z

    ce, z, grad_hidden, grad_weight = _by_autograd(COEFF)
    _, _, ce_only_hidden, _ = _by_autograd(0.0)
    hidden, head, labels = _case()
    hidden.requires_grad_()
    valid = int(labels.ne(-100).sum())
    loss, z_sum = chunked_cross_entropy_and_z(hidden, head, labels, valid=valid, chunk_tokens=3, z_coeff=COEFF)
    loss.backward()
    assert hidden.grad is not None and head.weight.grad is not None
    assert abs(loss.item() - ce.item()) <= 1e-6  # the value is the cross-entropy alone
    assert abs(z_sum.item() / valid - z.item()) <= 1e-6 * z.item()
    assert (hidden.grad - grad_hidden).abs().max().item() <= 1e-6
    assert (head.weight.grad - grad_weight).abs().max().item() <= 1e-6
    # the z-loss really is in the gradient: without it the gradient is another one
    assert (grad_hidden - ce_only_hidden).abs().max().item() > 1e-3


def test_folding_the_z_loss_keeps_the_value_to_the_bit_and_adds_its_gradient() -> None:
    from titan_core.models.loss import cross_entropy_loss
    from titan_core.train.z_loss import ZLoss

    ce, z, grad_hidden, grad_weight = _by_autograd(COEFF)
    hidden, head, labels = _case()
    hidden.requires_grad_()
    zl = ZLoss(COEFF, torch.device("cpu"))
    zl.start_step()
    logits = head(hidden)
    plain = cross_entropy_loss(logits, labels)
    folded = zl.fold(plain, logits, labels, valid=int(labels.ne(-100).sum()))
    assert folded.item() == plain.item() == ce.item()
    folded.backward()
    assert hidden.grad is not None and head.weight.grad is not None
    assert (hidden.grad - grad_hidden).abs().max().item() <= 1e-6
    assert (head.weight.grad - grad_weight).abs().max().item() <= 1e-6
    # the step's value per valid token, as logged
    assert zl.step_value(global_valid=int(labels.ne(-100).sum()), tp=1, distributed=False) == pytest.approx(
        z.item(), rel=1e-6)
    # off, under no_grad (validation) and with no valid label: the loss as it was, nothing recorded
    with torch.no_grad():
        assert zl.fold(plain, logits, labels, valid=11) is plain
    assert ZLoss(0.0, torch.device("cpu")).fold(plain, logits, labels, valid=11) is plain
    assert zl.fold(plain, logits, labels, valid=0) is plain


def test_the_spike_guard_judges_against_the_window_of_accepted_losses() -> None:
    from titan_core.train.spike_guard import SpikeGuard

    guard = SpikeGuard(window=3, sigmas=2.0, min_steps=3)
    assert not guard.judge(1, 100.0, is_rank0=False)  # too few accepted steps: nothing is judged
    for step, loss in enumerate([3.0, 3.2, 2.8], start=2):
        assert not guard.judge(step, loss, is_rank0=False)
    assert guard.losses == [3.0, 3.2, 2.8]  # the window keeps the last 3: 100.0 is gone
    bar = guard.limit()
    assert bar is not None
    mean = (3.0 + 3.2 + 2.8) / 3
    std = ((0.0 ** 2 + 0.2 ** 2 + 0.2 ** 2) / 3) ** 0.5
    assert bar == pytest.approx((mean + 2 * std, mean, std), rel=1e-12)
    assert guard.judge(5, bar[0] + 1e-3, is_rank0=False) and guard.spikes == 1
    assert guard.losses == [3.0, 3.2, 2.8]  # a spike does not join the window
    assert not guard.judge(6, bar[0], is_rank0=False)  # at the limit: accepted
    # the checkpoint entry round-trips exactly; a longer saved window keeps its newest losses
    again = SpikeGuard(window=2, sigmas=2.0, min_steps=2)
    again.load_state_dict(guard.state_dict())
    assert again.losses == guard.losses[-2:]


def test_a_damaged_spike_guard_entry_is_refused_with_a_message() -> None:
    from titan_core.errors import CheckpointError
    from titan_core.train.spike_guard import SpikeGuard

    with pytest.raises(CheckpointError, match="spike_guard entry is not a list of finite losses"):
        SpikeGuard(window=4, sigmas=2.0, min_steps=2).load_state_dict({"losses": [1.0, "x"]})


@pytest.mark.parametrize(("pairs", "message"), [
    ({"z_loss": -1e-4}, "greater than or equal to 0"),
    ({"spike_window": 10, "spike_min_steps": 11}, "spike_min_steps=11 exceeds stability.spike_window=10"),
    ({"spike_sigmas": 0}, "greater than 0"),
    ({"spike_rollback": 3}, "spike_rollback=3 needs the spike guard"),
])
def test_the_stability_section_refuses_bad_values(pairs: dict[str, float], message: str) -> None:
    from pydantic import ValidationError

    from titan_core.config.stability import StabilitySection

    with pytest.raises(ValidationError, match=message):
        StabilitySection(**pairs)  # type: ignore[arg-type]
    assert StabilitySection().z_loss == 0 and StabilitySection().spike_guard is False  # off by default


def test_titan_report_notes_the_steps_the_spike_guard_skipped(tmp_path: Path) -> None:
    from titan_core.observability.report import write_run_report

    lines = [{"step": s, "loss": loss, "grad_norm": 1.0, "lr": 1e-3, "spike_skipped": int(s == 3), "z_loss": 0.06}
             for s, loss in ((1, 3.0), (2, 2.9), (3, 9.5), (4, 2.8))]
    lines[2]["spike_rollback"] = 1
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    html = write_run_report(tmp_path).html.read_text()
    assert "1 loss spike skipped by the guard (step 3)" in html
    assert "rolled back to a checkpoint after repeated spikes at step 3" in html
    assert "<figcaption>z-loss (added to the trained loss)</figcaption>" in html
    for r in lines:
        del r["z_loss"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert "z-loss" not in write_run_report(tmp_path).html.read_text()  # no chart, no note, without one


def test_a_rollback_needs_checkpoints_and_the_guard_is_refused_with_fault_tolerance() -> None:
    from pydantic import ValidationError

    from titan_core.config.job import JobConfig

    stability = {"spike_guard": True, "spike_rollback": 3}
    with pytest.raises(ValidationError, match="spike_rollback=3 rolls back to the run's newest checkpoint: set "
                                              "checkpoint.enable=true"):
        JobConfig.model_validate({"stability": stability}, context={"world_size": 1})
    JobConfig.model_validate({"stability": stability, "checkpoint": {"enable": True}}, context={"world_size": 1})
    with pytest.raises(ValidationError, match="stability.spike_guard with fault tolerance is not supported yet"):
        JobConfig.model_validate({"stability": {"spike_guard": True}, "fault_tolerance": {"local_replicas": 2}},
                                 context={"world_size": 1})


def test_a_pipeline_step_keeps_the_z_loss_of_its_scheduled_losses_only() -> None:
    # torch's first pipeline step calls the loss once more (to infer the backward's shapes) before its microbatches
    from titan_core.train.z_loss import ZLoss

    zl = ZLoss(1.0, torch.device("cpu"))
    zl.start_step()
    zl.record(torch.tensor(5.0))  # an earlier accumulation micro-batch: kept
    mark = zl.mark()
    for value in (100.0, 1.0, 2.0):  # the shape inference's call, then two microbatches
        zl.record(torch.tensor(value))
    zl.keep_last_since(mark, 2)
    assert zl.step_value(global_valid=4, tp=1, distributed=False) == (5.0 + 1.0 + 2.0) / 4
    zl.keep_last_since(zl.mark(), 0)  # a rank without the last stage: nothing recorded, nothing dropped
    assert len(zl.sums) == 3
