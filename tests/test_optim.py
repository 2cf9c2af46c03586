"""OptimizersContainer and LRSchedulersContainer: one optimizer over all parts, schedules by formula."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from titan_core import LRSchedulersContainer, LRSchedulerSection, OptimizersContainer, OptimizerSection


def parts() -> list[nn.Module]:
    torch.manual_seed(0)
    a, b = nn.Linear(4, 4), nn.Linear(4, 2)
    b.bias.requires_grad_(False)
    return [a, b]


def test_container_is_an_optimizer_over_all_trainable_parameters() -> None:
    model_parts = parts()
    opt = OptimizersContainer(model_parts, OptimizerSection(lr=0.1, weight_decay=0.0), device_type="cpu")
    assert isinstance(opt, torch.optim.Optimizer)
    params = [p for g in opt.param_groups for p in g["params"]]
    assert len(params) == 3  # the frozen bias is left out
    assert all(p is not model_parts[1].bias for p in params)


def test_step_matches_one_plain_adamw_and_hooks_run_once() -> None:
    a_parts, b_parts = parts(), parts()
    cfg = OptimizerSection(lr=0.01, weight_decay=0.1, no_decay_norms_biases_embeddings=False)  # one group, as plain AdamW
    container = OptimizersContainer(a_parts, cfg, device_type="cpu")
    plain = torch.optim.AdamW([p for m in b_parts for p in m.parameters() if p.requires_grad],
                              lr=0.01, betas=cfg.betas, eps=cfg.eps, weight_decay=0.1)
    calls: list[int] = []
    container.register_step_post_hook(lambda *_: calls.append(1))
    x = torch.randn(3, 4)
    for _ in range(3):
        for model_parts, opt in ((a_parts, container), (b_parts, plain)):
            opt.zero_grad()
            model_parts[1](model_parts[0](x)).pow(2).sum().backward()
            opt.step()
    for pa, pb in zip((p for m in a_parts for p in m.parameters()), (p for m in b_parts for p in m.parameters())):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    assert len(calls) == 3


def lrs(decay_type: str, steps: int = 10, warmup: int = 2, **kw: float) -> list[float]:
    opt = OptimizersContainer(parts(), OptimizerSection(lr=1.0), device_type="cpu")
    sched = LRSchedulersContainer(opt, LRSchedulerSection(warmup_steps=warmup, decay_type=decay_type, **kw),
                                  total_steps=steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_then_linear_decay() -> None:
    got = lrs("linear", min_lr_factor=0.0)
    assert got[:2] == pytest.approx([1 / 3, 2 / 3])
    assert got[2:] == pytest.approx([1 - i / 8 for i in range(8)])


def test_cosine_decay() -> None:
    got = lrs("cosine", min_lr_factor=0.1)
    assert got[2:] == pytest.approx([0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / 8)) for i in range(8)])


def test_wsd_is_constant_then_decays() -> None:
    got = lrs("wsd", decay_ratio=0.25, min_lr_factor=0.0)
    assert got[2:8] == pytest.approx([1.0] * 6)
    assert got[8:] == pytest.approx([1.0, 0.5])


def test_scheduler_state_round_trip() -> None:
    opt = OptimizersContainer(parts(), OptimizerSection(lr=1.0), device_type="cpu")
    sched = LRSchedulersContainer(opt, LRSchedulerSection(warmup_steps=2), total_steps=10)
    for _ in range(5):
        opt.step()
        sched.step()
    fresh_opt = OptimizersContainer(parts(), OptimizerSection(lr=1.0), device_type="cpu")
    fresh = LRSchedulersContainer(fresh_opt, LRSchedulerSection(warmup_steps=2), total_steps=10)
    fresh.load_state_dict(sched.state_dict())
    assert fresh.get_last_lr() == sched.get_last_lr()
    assert [g["lr"] for g in fresh_opt.param_groups] == [g["lr"] for g in opt.param_groups]
