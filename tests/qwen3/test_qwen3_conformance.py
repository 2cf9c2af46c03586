"""The conformance kit's quick checks on the qwen3 MoE flavor (import, meta build, FLOPs/token
against the matmuls really run, the HF round trip with stacked experts, the loss falling).

The dense flavor goes through the same checks in ``titan-plugin check qwen3 --fast``; one class
here keeps the CI time down."""

from __future__ import annotations

from pathlib import Path

from titan_core.testing import TrainSpecConformance
from titan_core.testing.checks import SPEC_CHECKS, Target, run_check


class TestQwen3MoE(TrainSpecConformance):
    train_spec = "qwen3"
    flavor = "debugmoe"
    fast = True


def test_the_kit_checks_ep_on_a_moe_flavor_and_skips_a_dense_one(tmp_path: Path) -> None:
    """'EP 2 = 1 process' (not in the fast subset above): run on debugmoe cut to 2 layers and 32 tokens, skipped on debugmodel."""
    check = next(c for c in SPEC_CHECKS if c.name == "EP 2 = 1 process")
    moe = Target("spec", "qwen3", flavor="debugmoe", extra_flags=("--qwen3.n_layers=2", "--training.seq_len=32"), workdir=tmp_path / "moe")
    result = run_check(moe, check)
    assert result.status == "pass", result.detail
    rel = float(result.figure.split("max rel diff ", 1)[1].split(",", 1)[0])
    assert rel <= 1e-4 and result.figure.endswith("6 params split"), result.figure  # 3 stacks x 2 layers
    dense = run_check(Target("spec", "qwen3", flavor="debugmodel", workdir=tmp_path / "dense"), check)
    assert (dense.status, dense.figure) == ("skip", "flavor debugmodel has no titan_core.moe experts (pick a MoE "
                                                    "flavor with --flavor)")
