"""Per-op selective checkpointing keeps no output of a block's last matmul when the backward never reads it.

A pre-norm block ends in a residual sum: the recompute stops (torch's early stop) before its last
matmul, so that matmul's kept output was memory held from the forward to the block's backward for
nothing. Once one forward of a block structure has run, blocks of that structure no longer keep it
(in the first step, every block but the first); a block with an op after its last matmul that saves
a tensor (a post-norm block's norm reads the matmul's output) keeps it as before. Gradients are the
plain run's bit for bit in every step, and no step recomputes more matmuls than before.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from op_counter import CountOps
from parallelize_helpers import parallelize_alone
from torch import nn

from titan_core import ActivationCheckpointSection
from titan_core.models.init import init_model_weights
from titan_core.parallel import apply_activation_checkpointing, spec_parallelize_fn
from titan_core.testing.tiny_spec import TINY_SPEC, TinyArgs, TinyTransformer

MM = torch.ops.aten.mm.default


class _Decisions:
    """Records, per forward of a checkpointed block, how many matmul outputs the policy kept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kept_per_forward: list[int] = []
        original = torch_checkpoint.create_selective_checkpoint_contexts

        def recording(policy: Any, *args: Any, **kwargs: Any) -> Any:
            self.kept_per_forward.append(0)
            slot = len(self.kept_per_forward) - 1

            def watched(ctx: Any, op: Any, *a: Any, **k: Any) -> Any:
                decision = policy(ctx, op, *a, **k)
                if op is MM and not ctx.is_recompute and decision == torch_checkpoint.CheckpointPolicy.MUST_SAVE:
                    self.kept_per_forward[slot] += 1
                return decision

            return original(watched, *args, **kwargs)

        monkeypatch.setattr(torch_checkpoint, "create_selective_checkpoint_contexts", recording)

    def take(self) -> list[int]:
        taken, self.kept_per_forward = self.kept_per_forward, []
        return taken


def _step(model: nn.Module, inputs: torch.Tensor) -> tuple[int, dict[str, torch.Tensor]]:
    """One forward and backward: (matmuls run by the backward, gradients). Token inputs train on
    their own next-token loss, float inputs on the output's mean square."""
    model.zero_grad(set_to_none=True)
    out = model(inputs)
    if inputs.dtype.is_floating_point:
        loss = out.square().mean()
    else:
        loss = nn.functional.cross_entropy(out.flatten(0, 1), inputs.flatten())
    with CountOps() as counter:
        loss.backward()
    return counter.counts[str(MM)], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _three_steps(model: nn.Module, inputs: torch.Tensor, decisions: _Decisions, plain_mm: int,
                 plain_grads: dict[str, torch.Tensor]) -> list[tuple[list[int], int]]:
    """Per step: (matmul outputs kept per block forward, matmuls recomputed); gradients checked against the plain run's."""
    per_step = []
    for _ in range(3):
        backward_mm, grads = _step(model, inputs)
        per_step.append((decisions.take(), backward_mm - plain_mm))
        assert all(torch.equal(plain_grads[n], grads[n]) for n in plain_grads)
    return per_step


def _tiny(**ac: Any) -> nn.Module:
    torch.manual_seed(0)
    model = TinyTransformer(TinyArgs(vocab_size=32))
    parallelize_alone(spec_parallelize_fn(TINY_SPEC), model, **ac)
    init_model_weights(model, seed=1)
    return model


def test_pre_norm_blocks_stop_keeping_their_last_matmul_after_the_first_one(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    _, plain_grads = _step(_tiny(), tokens)
    plain_mm, _ = _step(_tiny(), tokens)
    decisions = _Decisions(monkeypatch)
    per_step = _three_steps(_tiny(mode="selective"), tokens, decisions, plain_mm, plain_grads)
    # 2 blocks x 7 matmuls. The first block's first forward keeps the 1st, 3rd, 5th and 7th; every forward
    # after it (the second block's already, in step 1) leaves out the 7th (w2, whose output only feeds the
    # residual sum). The recompute stops before w2 either way: 3 matmuls a block in every step, never w2.
    assert per_step == [([4, 3], 6), ([3, 3], 6), ([3, 3], 6)]


class _PostNormBlock(nn.Module):
    """norm(x + fc3(relu(fc2(relu(fc1(x)))))): the norm's backward reads the last matmul's output."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (nn.Linear(width, width, bias=False) for _ in range(3))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x))))))


class _PostNormStack(nn.Module):
    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.layers = nn.ModuleDict({str(i): _PostNormBlock(width) for i in range(depth)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers.values():
            x = block(x)
        return x


def test_a_block_whose_backward_reads_its_last_matmul_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(4))
    plain_mm, plain_grads = _step(_PostNormStack(), x)
    decisions = _Decisions(monkeypatch)
    model = _PostNormStack()
    apply_activation_checkpointing(dict(model.layers.items()),
                                   ActivationCheckpointSection(mode="selective", selective_save_ops=["aten.mm.default"]))
    per_step = _three_steps(model, x, decisions, plain_mm, plain_grads)
    # 3 matmuls a block: the 1st and 3rd kept, the 2nd recomputed, in every step. The norm after the 3rd
    # saves its input (the 3rd's output plus the residual), so the 3rd stays kept.
    assert per_step == [([2, 2], 2), ([2, 2], 2), ([2, 2], 2)]
