"""Optimizer parameter groups (param_groups.py) and the WSD decay tails, against their definitions."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from titan_core import LRSchedulersContainer, LRSchedulerSection, OptimizersContainer, OptimizerSection
from titan_core.optim.containers import lr_multiplier
from titan_core.optim.param_groups import assign, describe_difference, layout


class Tiny(nn.Module):
    """Embedding, a norm, a biased linear and an output head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(10, 4)
        self.norm = nn.LayerNorm(4)
        self.proj = nn.Linear(4, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.tok.weight  # tied: one parameter object


def names(groups: dict[str, list[tuple[str, nn.Parameter]]]) -> dict[str, list[str]]:
    return {g: sorted(n for n, _ in members) for g, members in groups.items()}


def test_default_split_is_structural_norms_biases_embeddings_and_ties_undecayed() -> None:
    got = names(assign(Tiny(), OptimizerSection()))
    assert got == {"default": ["proj.weight"], "no_decay": ["norm.bias", "norm.weight", "proj.bias", "tok.weight"]}
    assert names(assign(Tiny(), OptimizerSection(no_decay_norms_biases_embeddings=False))) == {
        "default": ["norm.bias", "norm.weight", "proj.bias", "proj.weight", "tok.weight"]}


def test_rules_match_names_first_and_set_their_own_decay_and_lr() -> None:
    cfg = OptimizerSection(lr=0.1, weight_decay=0.2, param_groups=[
        {"name": "head", "patterns": ["proj.*"], "lr_mult": 0.5},
        {"name": "norms", "patterns": ["norm.*"], "weight_decay": 0.3},
    ])
    opt = OptimizersContainer([Tiny()], cfg, device_type="cpu")
    by_name = {g["group"]: g for g in opt.param_groups}
    # "default" is empty here (every matrix matched a rule), so the optimizer holds no such group
    assert {g: (v["weight_decay"], v["lr"], len(v["params"])) for g, v in by_name.items()} == {
        "no_decay": (0.0, 0.1, 1), "head": (0.2, 0.05, 2), "norms": (0.3, 0.1, 2)}
    # the scheduler scales every group by the same factor and reports the unscaled LR
    sched = LRSchedulersContainer(opt, LRSchedulerSection(warmup_steps=0, decay_type="linear", min_lr_factor=0.0),
                                  total_steps=4)
    opt.step()
    sched.step()
    assert by_name["head"]["lr"] == pytest.approx(0.05 * 0.75)
    assert sched.get_last_lr() == pytest.approx(0.1 * 0.75)


def test_undecayed_parameters_are_untouched_by_decay_with_zero_gradient() -> None:
    torch.manual_seed(0)
    model = Tiny()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = OptimizersContainer([model], OptimizerSection(lr=0.1, weight_decay=0.5), device_type="cpu")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradients: only decoupled weight decay can move a parameter
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"proj.weight"}
    assert torch.allclose(model.proj.weight, before["proj.weight"] * (1 - 0.1 * 0.5))


def test_group_names_are_checked() -> None:
    with pytest.raises(ValidationError, match="reserved"):
        OptimizerSection(param_groups=[{"name": "no_decay", "patterns": ["*"]}])
    with pytest.raises(ValidationError, match="repeat"):
        OptimizerSection(param_groups=[{"name": "a", "patterns": ["x"]}, {"name": "a", "patterns": ["y"]}])


def test_layout_difference_names_the_change() -> None:
    a = layout([Tiny()], OptimizerSection())
    assert describe_difference(a, layout([Tiny()], OptimizerSection())) is None
    assert describe_difference(a, layout([Tiny()], OptimizerSection(weight_decay=0.2))) == (
        "group 'default' has weight_decay=0.1 in the checkpoint but 0.2 now")
    moved = layout([Tiny()], OptimizerSection(param_groups=[{"name": "p", "patterns": ["proj.bias"]}]))
    assert "groups ['default', 'no_decay'] in the checkpoint but ['default', 'no_decay', 'p'] now" == (
        describe_difference(a, moved))


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_tails_follow_their_formulas(shape: str) -> None:
    cfg = LRSchedulerSection(warmup_steps=10, decay_type="wsd", decay_ratio=0.25, min_lr_factor=0.1,
                             wsd_decay_shape=shape)
    total, floor = 90, 0.1
    decay_len = round(0.25 * (total - 10))  # 20 steps of decay at the end
    start = total - decay_len

    def expected(step: int) -> float:
        if step < 10:
            return (step + 1) / 11
        if step < start:
            return 1.0
        p = min(1.0, (step - start) / decay_len)
        tail = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * p)), "1-sqrt": 1 - math.sqrt(p)}[shape]
        return floor + (1 - floor) * tail

    for step in range(total + 1):
        assert lr_multiplier(step, warmup=10, total=total, config=cfg) == pytest.approx(expected(step), abs=1e-12), step
    quarter = lr_multiplier(start + 5, warmup=10, total=total, config=cfg)  # progress 0.25
    assert quarter == pytest.approx({"linear": 0.775, "cosine": 0.1 + 0.9 * (0.5 + 0.5 * math.cos(math.pi / 4)),
                                     "1-sqrt": 0.55}[shape])
