"""The conformance kit's quick checks on the qwen3 MoE flavor (import, meta build, FLOPs/token
against the matmuls really run, the HF round trip with stacked experts, the loss falling).

The dense flavor goes through the same checks in ``titan-plugin check qwen3 --fast``; one class
here keeps the CI time down."""

from __future__ import annotations

from titan_core.testing import TrainSpecConformance


class TestQwen3MoE(TrainSpecConformance):
    train_spec = "qwen3"
    flavor = "debugmoe"
    fast = True
