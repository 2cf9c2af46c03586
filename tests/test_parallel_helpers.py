"""titan_core.parallel on one process: the errors a spec author can hit, and checkpointing from the spec's op list.

The multi-process numbers (FSDP2 / HSDP / TP / PP against one process) are in tests/llama/
(titan-llama's parallelize_fn is the default one plus an op-list rule) and in
tests/test_example_train_spec.py (TinyGPT's TP plan through the default parallelize_fn).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from op_counter import CountOps
from parallelize_helpers import parallelize_alone
from torch import nn

from titan_core import (
    ActivationCheckpointSection,
    ConfigError,
    PluginError,
    default_parallelize_fn,
)
from titan_core.models.init import init_model_weights
from titan_core.parallel import apply_activation_checkpointing, apply_tensor_parallel, spec_parallelize_fn
from titan_core.testing.tiny_spec import TINY_SPEC, TinyArgs, TinyTransformer

MM = "aten.mm.default"


def _parallelize(model: nn.Module, fn: Any, *, tp: int = 1, **ac: Any) -> nn.Module:
    return parallelize_alone(fn, model, tp=tp, **ac)


def test_tp_without_a_plan_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="spec x has no tensor-parallel plan, but parallelism.tp=2"):
        _parallelize(nn.Linear(2, 2), default_parallelize_fn(None, spec_name="spec x"), tp=2)


def test_a_plan_naming_a_missing_module_is_the_plugins_error() -> None:
    model = TinyTransformer(TinyArgs(vocab_size=16))
    with pytest.raises(PluginError, match=r"does not have: \['layers.0.mlp.fc_in'\]"):
        apply_tensor_parallel(model, None, {"layers.0.attention.wq": object(), "layers.0.mlp.fc_in": object()})


def test_per_op_checkpointing_without_an_op_list_is_a_config_error() -> None:
    blocks = {"0": nn.Linear(2, 2)}
    with pytest.raises(ConfigError, match="this spec supplies none. Set activation_checkpoint.selective_save_ops"):
        apply_activation_checkpointing(blocks, ActivationCheckpointSection(mode="selective"))


def _backward_mm(**ac: Any) -> tuple[int, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyTransformer(TinyArgs(vocab_size=32))
    _parallelize(model, spec_parallelize_fn(TINY_SPEC), **ac)
    init_model_weights(model, seed=1)
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    with CountOps() as counter:
        loss.backward()
    return counter.counts[MM], {n: p.grad for n, p in model.named_parameters()}


def test_per_op_checkpointing_uses_the_spec_list_unless_the_config_names_one() -> None:
    plain, grads = _backward_mm()
    full, full_grads = _backward_mm(mode="full")
    spec_list, spec_grads = _backward_mm(mode="selective")  # the tiny spec saves mm (every other one)
    nothing_saved, _ = _backward_mm(mode="selective", selective_save_ops=["aten.add.Tensor"])
    recomputed = {"full": full - plain, "spec": spec_list - plain, "config": nothing_saved - plain}
    # 2 blocks x 7 linears. Full recomputes 6 per block: non-reentrant checkpointing stops once
    # backward has every tensor it needs, so the block's last matmul (w2) is never rerun. The
    # spec's list keeps the 1st, 3rd, 5th and 7th matmul: 3 per block recomputed. A config list
    # without mm replaces the spec's, so everything is recomputed again.
    assert recomputed == {"full": 12, "spec": 6, "config": 12}
    for other in (full_grads, spec_grads):
        assert all(torch.equal(grads[n], other[n]) for n in grads)


def test_compile_goes_around_the_experts_of_a_moe_block() -> None:
    from titan_core.moe import MoE
    from titan_core.parallel.compile import apply_compile

    class Block(nn.Module):
        def __init__(self, ffn: nn.Module) -> None:
            super().__init__()
            self.norm, self.attention, self.ffn = nn.LayerNorm(8), nn.Linear(8, 8), ffn

    shared = nn.Linear(8, 8)
    moe = Block(MoE(8, 16, 4, 2, norm_topk_prob=True, shared_experts=shared))
    dense = Block(nn.Linear(8, 8))
    apply_compile([dense, moe])

    def compiled(m: nn.Module) -> bool:
        return getattr(m, "_compiled_call_impl", None) is not None

    assert compiled(dense)  # a block without experts: compiled whole, as before
    # Around the experts: the block and its MoE layer run eagerly, everything else in them compiled.
    ffn: Any = moe.ffn
    assert [compiled(m) for m in (moe, moe.norm, moe.attention, ffn, ffn.router, ffn.experts, shared)] == [
        False, True, True, False, True, False, True]
